"""What the generic MLX backend asks of an accelerator, and nothing more.

The backend and its decode batch run any mlx-lm model with mlx-lm's own forward pass. An
accelerator (today the CPU one, ``cpu/``, handed in by the composition root) may take
some passes off MLX: a small pass in one host call, a prompt chunk riding a decode step,
a long prompt sliced between steps, a decode step's body beside the slice. The backend
only ever sees this protocol: what it may do differs by model and machine, and a method
that cannot take a pass says so (``None``) and the pass runs on MLX.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import mlx.core as mx

    from semantic.adapters.mlx.kv.restored_prefix import RestoredPrefix
    from semantic.ports.model_backend import DecodedToken, StepOutput


@dataclass(frozen=True, slots=True)
class Group:
    """One sequence group's input tokens ``(batch, length)`` and its per-layer caches."""

    tokens: mx.array
    caches: list[Any]
    prefix: RestoredPrefix | None = None
    """Positions before the caches', read where they lie: only the host pass takes these."""


class PreparedBody(Protocol):
    """A pass's body made ready on the engine thread, to ``run`` on another, then
    ``finish`` on the engine thread: each group's final hidden states."""

    def run(self) -> None: ...

    def finish(self) -> list[mx.array]: ...


@dataclass(frozen=True, slots=True)
class PendingStep:
    """A decode step begun (``StepDecoder.begin_step``): its body, and the tokens it feeds."""

    body: PreparedBody
    fed: mx.array
    fed_tops: mx.array


class StepDecoder(Protocol):
    """The decode batch as a step beside a slice uses it: begun on the engine thread, its
    body run elsewhere, finished on the engine thread."""

    def begin_step(self) -> PendingStep | None: ...

    def finish_step(self, pending: PendingStep) -> list[DecodedToken]: ...


class PromptSlice(Protocol):
    """A prompt chunk part way through the layers: ``advance`` runs steps within
    ``seconds``; once it returns True, ``hidden`` is the body's final output."""

    @property
    def hidden(self) -> mx.array: ...

    def advance(
        self,
        body: Any,
        caches: list[Any],
        seconds: float,
        *,
        must_progress: bool,
        between: Callable[[], bool] | None,
    ) -> bool: ...


class StepBeside(Protocol):
    """A decode step whose body runs beside a prompt slice: ``begin``, ``catch_up``
    between the slice's steps (whether the body still runs), ``end``."""

    def begin(self) -> bool: ...

    def catch_up(self) -> bool: ...

    def end(self) -> StepOutput: ...


class Passes(Protocol):
    """What the decode batch asks: its passes' final hidden states, off MLX."""

    def hidden(self, groups: Sequence[Group]) -> list[mx.array] | None:
        """Each group's final hidden states, the caches advanced; None: not taken."""
        ...

    def prepare(self, groups: Sequence[Group]) -> PreparedBody | None:
        """A body to run elsewhere; None: not taken (nothing done)."""
        ...

    def fused_hidden(self, groups: list[Group]) -> list[mx.array]:
        """Several groups (the batch and a riding chunk) in one pass on MLX."""
        ...


class Accelerator(Passes, Protocol):
    """What the backend asks, besides the decode batch's passes."""

    @property
    def ride_rows(self) -> int:
        """Rows a decode step's pass may carry with a prompt chunk; 0: chunks never ride."""
        ...

    @property
    def host_rows(self) -> int:
        """Rows a host pass takes at most; 0: no host pass for this model here."""
        ...

    def start_slice(
        self,
        body: Any,
        tokens: Sequence[int],
        caches: list[Any],
        size: Callable[[Any], None] | None,
    ) -> PromptSlice:
        """A llama body's chunk, to run a few steps at a time; ``size`` sizes an empty
        layer cache before that layer's attention."""
        ...

    def beside(
        self, decoder: StepDecoder, report: Callable[[list[DecodedToken]], StepOutput]
    ) -> StepBeside | None:
        """Decode steps whose body can run beside a slice; None where they cannot."""
        ...
