"""A backend made of steps, as the MLX backend is, for the tests of ``RoundRunner``.

``StepBackend`` answers the port's ``run`` with ``RoundRunner`` driving steps of its own;
each step is one small round of the plain fake (``fake``: its tokens and its log), and
raises what that round failed with, as a real step raises. What the runner adds (the
order, the clock a slice is reckoned by, a slice going on into the next chunk, the step
beside a slice, each failure failing only its sequences) is the runner's own.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from semantic.application.scheduler.round_runner import RoundRunner
from semantic.ports.model_backend import (
    BackendCapabilities,
    ExportedKV,
    Failed,
    Join,
    Outcome,
    Prefilled,
    PromptChunk,
    PromptPart,
    RoundResult,
    RoundWork,
    SampledToken,
    SliceProgress,
    StepFailed,
    StepOutput,
    Stepped,
    WholePrompts,
)
from tests.unit.fakes import FakeBackend


@dataclass
class StepBackend:
    fake: FakeBackend = field(default_factory=FakeBackend)
    slice_calls: int = 3
    """Calls a sliced chunk takes when its time is bounded (the model's layers, in thirds)."""
    side_by_side: bool = False
    """Whether a sliced round's decode step may be begun beside its slice."""
    fail_beside: bool = False
    """A step begun beside a slice fails as it ends."""
    slices: list[tuple[str, int, bool]] = field(default_factory=list)
    """(sequence, chunk tokens, done) for each ``prefill_slice`` call."""
    beside: list[StepOutput] = field(default_factory=list)
    """The output of each step begun beside a slice, in order."""
    _sliced: dict[str, int] = field(default_factory=dict)
    _begun: StepOutput | None = None

    @property
    def capabilities(self) -> BackendCapabilities:
        return replace(self.fake.capabilities, can_slice=True)

    @property
    def decoding_count(self) -> int:
        return len(self.fake.model.decoding())

    def clock(self) -> float:
        return time.monotonic()

    def open_sequence(self, seq_id: str, **kwargs: Any) -> bool:
        return self.fake.open_sequence(seq_id, **kwargs)

    def copy_prefix(self, source_id: str, target_id: str, n_tokens: int, room: int) -> bool:
        return self.fake.copy_prefix(source_id, target_id, n_tokens, room)

    def close_sequence(self, seq_id: str, keep_tokens: int) -> ExportedKV:
        self._sliced.pop(seq_id, None)
        return self.fake.close_sequence(seq_id, keep_tokens)

    def run(self, work: RoundWork) -> RoundResult:
        return RoundResult(RoundRunner(self, self.clock).run(work))

    def _one(self, *, decode: bool = False, ride: PromptChunk | None = None, **kw: Any) -> Outcome:
        """One step, as a round of the model with nothing else in it."""
        outcomes = self.fake.run(RoundWork(decode=decode, ride=ride, **kw)).outcomes
        for outcome in outcomes:
            if isinstance(outcome, Failed | StepFailed):
                raise outcome.error
        return outcomes[0]

    def _prefilled(self, part: PromptPart) -> Prefilled:
        done = self._one(parts=(part,))
        assert isinstance(done, Prefilled)
        return done

    def start_decoding(self, seq_id: str, first_token: int, max_new_tokens: int) -> None:
        self.fake.run(RoundWork(decode=False, joins=(Join(seq_id, first_token, max_new_tokens),)))

    def decode_step(self, ride: PromptChunk | None = None) -> StepOutput:
        stepped = self._one(decode=True, ride=ride)
        assert isinstance(stepped, Stepped)
        return stepped.output

    def begin_decode_step(self) -> bool:
        if not self.side_by_side or self._begun is not None:
            return False
        self._begun = self.decode_step()  # the work is done at once; only its report waits
        return True

    def end_decode_step(self) -> StepOutput:
        output, self._begun = self._begun, None
        if output is None:
            raise RuntimeError("no decode step was begun beside a slice")
        if self.fail_beside:
            raise RuntimeError("the step beside the slice failed on purpose")
        self.beside.append(output)
        return output

    def prefill(self, seq_id: str, tokens: Sequence[int]) -> None:
        self._prefilled(PromptChunk(seq_id, tuple(tokens), last=False))

    def prefill_and_sample(self, seq_id: str, tokens: Sequence[int]) -> SampledToken:
        first = self._prefilled(PromptChunk(seq_id, tuple(tokens), last=True)).firsts[0]
        assert first is not None
        return first

    def prefill_many_and_sample(
        self, prompts: Sequence[tuple[str, Sequence[int]]]
    ) -> list[SampledToken]:
        if any(tokens[0] in self.fake.fail_prefill_for for _, tokens in prompts):
            raise RuntimeError("batched prefill failed on purpose")  # all or nothing, like MLX
        done = self._prefilled(WholePrompts(tuple((s, tuple(t)) for s, t in prompts)))
        return [first for first in done.firsts if first is not None]

    def prefill_slice(
        self,
        seq_id: str,
        tokens: Sequence[int],
        seconds: float,
        *,
        last: bool,
        must_progress: bool = True,
    ) -> SliceProgress:
        calls = self._sliced.pop(seq_id, 0) + 1
        done = calls >= self.slice_calls or math.isinf(seconds)
        self.slices.append((seq_id, len(tokens), done))
        if not done:
            self._sliced[seq_id] = calls
            return SliceProgress(False)
        if last:
            return SliceProgress(True, self.prefill_and_sample(seq_id, tokens))
        self.prefill(seq_id, tokens)
        return SliceProgress(True)


@dataclass
class ClockedStepBackend(StepBackend):
    """Steps of ``step_s`` and slice calls of ``slice_s`` on a clock of its own; each slice
    call noted as (tokens, seconds given, must progress)."""

    now: float = 0.0
    step_s: float = 0.010
    slice_s: float = 0.0
    calls: list[tuple[int, float, bool]] = field(default_factory=list)

    @property
    def budgets(self) -> list[float]:
        """The seconds each slice call was given, in order."""
        return [seconds for _, seconds, _ in self.calls]

    def clock(self) -> float:
        return self.now

    def decode_step(self, ride: PromptChunk | None = None) -> StepOutput:
        self.now += self.step_s
        return super().decode_step(ride)

    def prefill_slice(
        self,
        seq_id: str,
        tokens: Sequence[int],
        seconds: float,
        *,
        last: bool,
        must_progress: bool = True,
    ) -> SliceProgress:
        self.calls.append((len(tokens), seconds, must_progress))
        self.now += self.slice_s
        return super().prefill_slice(
            seq_id, tokens, seconds, last=last, must_progress=must_progress
        )
