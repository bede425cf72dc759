"""The CPU accelerator behind the backend's ``Accelerator`` protocol (``../accelerator.py``).

One object per model, made by the composition root (``cpu.accelerator_for``) and handed to
the backend, which hands it to its decode batch: the host pass (ADR 0013), prompt chunks
riding decode steps (ADR 0009), long prompts sliced between steps with each slice's step
times carried to the next, and the decode body beside the slice (ADR 0015). Each is on
only where the model and the machine allow it (``accelerations`` says why not).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx

from semantic.adapters.mlx.accelerator import (
    Group,
    PreparedBody,
    PromptSlice,
    StepBeside,
    StepDecoder,
)
from semantic.adapters.mlx.cpu.fused_pass import MAX_ROWS, fused_hidden, supports_fusion
from semantic.adapters.mlx.cpu.host_pass import HostPass
from semantic.adapters.mlx.cpu.layer_slice import LayerSlice, StepTimes
from semantic.adapters.mlx.cpu.side_by_side import step_beside_slice
from semantic.ports.model_backend import DecodedToken, StepOutput


class CpuAccelerator:
    def __init__(self, model: Any, host: HostPass | None, fusion: bool) -> None:
        self._model = model
        self._host = host
        self._fusion = fusion
        self._step_times = StepTimes()  # a slice's last time for each step of a layer

    @classmethod
    def of(cls, model: Any) -> CpuAccelerator:
        return cls(model, HostPass.of(model), supports_fusion(model))

    @property
    def ride_rows(self) -> int:
        return MAX_ROWS if self._fusion else 0

    @property
    def host_rows(self) -> int:
        return MAX_ROWS if self._host is not None else 0

    def hidden(self, groups: Sequence[Group]) -> list[mx.array] | None:
        return self._host.hidden(groups) if self._host is not None else None

    def prepare(self, groups: Sequence[Group]) -> PreparedBody | None:
        return self._host.prepare(groups) if self._host is not None else None

    def fused_hidden(self, groups: list[Group]) -> list[mx.array]:
        return fused_hidden(self._model, groups)

    def start_slice(
        self,
        body: Any,
        tokens: Sequence[int],
        caches: list[Any],
        size: Callable[[Any], None] | None,
    ) -> PromptSlice:
        chunk = LayerSlice.start(body, tokens, caches, self._step_times, size)
        return _TimedSlice(chunk, self._remember)

    def _remember(self, times: StepTimes) -> None:
        self._step_times = times

    def beside(
        self, decoder: StepDecoder, report: Callable[[list[DecodedToken]], StepOutput]
    ) -> StepBeside | None:
        return step_beside_slice(decoder, report) if self._host is not None else None


class _TimedSlice:
    """A layer slice that hands its step times on after each ``advance``: the next
    chunk's steps are predicted from them."""

    def __init__(self, chunk: LayerSlice, remember: Callable[[StepTimes], None]) -> None:
        self._chunk = chunk
        self._remember = remember

    @property
    def hidden(self) -> mx.array:
        return self._chunk.hidden

    def advance(
        self,
        body: Any,
        caches: list[Any],
        seconds: float,
        *,
        must_progress: bool,
        between: Callable[[], bool] | None,
    ) -> bool:
        done = self._chunk.advance(
            body, caches, seconds, must_progress=must_progress, between=between
        )
        self._remember(self._chunk.times)
        return done
