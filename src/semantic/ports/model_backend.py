"""The model backend port: the tensor work of prefill, batched decode and KV blocks.

The application decides what runs when (admission, chunk sizes, block accounting, when a
request ends); the backend only executes it. Sequences are named by the caller's ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from semantic.domain.blocks import AgentBlocks
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.generation import SamplingParams
from semantic.ports.grammar import GrammarMatcher


@dataclass(frozen=True, slots=True)
class BlockPayload:
    """One layer's KV for one block, as cut from a finished sequence's cache."""

    index: int
    start: int
    n_tokens: int
    data: object


@dataclass(frozen=True, slots=True)
class ExportedKV:
    """A closed sequence's KV: ``n_tokens`` positions, cut into blocks layer by layer."""

    n_tokens: int
    layers: list[list[BlockPayload]]


@dataclass(frozen=True, slots=True)
class SampledToken:
    token: int
    top_prob: float | None


@dataclass(frozen=True, slots=True)
class SliceProgress:
    done: bool
    """Whether every layer has the chunk now."""
    first_token: SampledToken | None = None
    """Sampled when the prompt's last chunk is done."""


@dataclass(frozen=True, slots=True)
class DecodedToken:
    """One token a decode step produced for one sequence.

    ``finished`` is set when the backend itself stopped the sequence (its token budget or
    an end-of-turn token); the sequence's cache then waits for ``close_sequence``.
    """

    seq_id: str
    token: int
    top_prob: float | None
    finished: bool


@dataclass(frozen=True, slots=True)
class PromptChunk:
    """Prompt tokens of one prefilling sequence, to be computed in the decode step's own
    forward pass; ``last``: the prompt's final chunk, whose first token is sampled."""

    seq_id: str
    tokens: tuple[int, ...]
    last: bool


@dataclass(frozen=True, slots=True)
class StepOutput:
    tokens: list[DecodedToken]
    first_token: SampledToken | None = None
    """The ridden chunk's first token, when it was its prompt's last chunk."""
    failed: dict[str, Exception] = field(default_factory=dict)
    """Sequences that could not join this step (their cache failed to build), by id: they
    are out of the batch, and only they fail; the others decoded as usual."""


@dataclass(frozen=True, slots=True)
class BackendCapabilities:
    """What a backend is and can do, fixed when it is built: the engine reads it once,
    instead of asking mid-round."""

    spec: ModelCacheSpec
    model_id: str
    can_slice: bool = False
    """Whether ``prefill_slice`` can stop inside the model (else it runs whole chunks)."""
    ride_rows: int = 0
    """Rows a decode step's forward pass may hold, prompt tokens riding it included
    (0: a prompt chunk never rides, as on a model without the fused pass)."""

    def ride_capacity(self, decoding: int) -> int:
        """Prompt tokens that can ride a decode step of ``decoding`` sequences without
        changing any result (0 with nothing decoding: there is no step to ride)."""
        return max(0, self.ride_rows - decoding) if decoding else 0


class ModelBackend(Protocol):
    """Executes the engine's plan on a real model.

    Lifecycle of a sequence: ``open_sequence`` (with restored blocks, gathered once into a
    contiguous cache) -> ``prefill`` chunks -> ``prefill_and_sample`` (the last chunk, which
    yields the first token) -> ``start_decoding`` -> ``decode_step`` until the engine decides
    it ends -> ``close_sequence`` (cuts the KV into blocks). ``close_sequence`` may be called
    at any stage, which is how cancellation works.
    """

    @property
    def capabilities(self) -> BackendCapabilities:
        """The same value for the backend's whole life."""
        ...

    def open_sequence(
        self,
        seq_id: str,
        *,
        restored: AgentBlocks | None,
        n_restored: int,
        n_new: int,
        sampling: SamplingParams,
        track_top_prob: bool = False,
        matcher: GrammarMatcher | None = None,
    ) -> None:
        """Create the sequence's cache from the first ``n_restored`` tokens of ``restored``,
        sized once for the ``n_new`` prompt tokens that will be prefilled after them.
        ``matcher``: every token sampled for the sequence (its first one too) is drawn from
        the tokens it allows, with the sampling settings applied among them, and told to
        it; free sequences in the same batch decode exactly as they would alone."""
        ...

    def prefill(self, seq_id: str, tokens: Sequence[int]) -> None:
        """Run ``tokens`` through the model into the sequence's cache."""
        ...

    def prefill_and_sample(self, seq_id: str, tokens: Sequence[int]) -> SampledToken:
        """Like ``prefill`` for the prompt's last chunk; samples the first new token."""
        ...

    def prefill_slice(
        self,
        seq_id: str,
        tokens: Sequence[int],
        seconds: float,
        *,
        last: bool,
        must_progress: bool = True,
    ) -> SliceProgress:
        """Compute ``tokens`` a part of the model at a time while the next part is expected
        to end within ``seconds``, then stop; called again with the same tokens, continue
        where it stopped. At least one part runs, unless not ``must_progress`` (time left
        over from another chunk). ``last``: the prompt's final chunk, whose first token is
        sampled when the chunk is done."""
        ...

    def prefill_many_and_sample(
        self, prompts: Sequence[tuple[str, Sequence[int]]]
    ) -> list[SampledToken]:
        """Whole prompts of fresh sequences (nothing restored, nothing prefilled) in as few
        forward passes as the backend can; one first token each, in order. A burst of short
        prompts then pays a pass's fixed cost once, not once per prompt."""
        ...

    def copy_prefix(self, source_id: str, target_id: str, n_tokens: int, room: int) -> bool:
        """Make the target's cache a copy of the source's first ``n_tokens`` positions
        (which the source has prefilled), with room for ``room`` more; False (nothing
        changed) where the source's cache cannot be copied so."""
        ...

    def start_decoding(self, seq_id: str, first_token: int, max_new_tokens: int) -> None:
        """Join the batched decoder; ``first_token`` is fed next, then up to
        ``max_new_tokens`` more are made."""
        ...

    def decode_step(self, ride: PromptChunk | None = None) -> StepOutput:
        """One batched decode step for every decoding sequence; ``ride`` (at most
        ``capabilities.ride_capacity(decoding_count)`` tokens) is prefilled in the same
        forward pass."""
        ...

    def begin_decode_step(self) -> bool:
        """Begin the decode step to run beside the prompt slices that follow in this round
        (on another core, where the backend can); ``end_decode_step`` then gives its
        output. False: nothing begun, call ``decode_step`` instead."""
        ...

    def end_decode_step(self) -> StepOutput:
        """The output of the step ``begin_decode_step`` began, once it is done."""
        ...

    def reads_restored(self, seq_id: str) -> bool:
        """True while the sequence still reads the blocks it restored from where they lie
        (their memory is in use: keep them pinned); False once its cache holds a copy."""
        ...

    @property
    def decoding_count(self) -> int:
        """Sequences in the batched decoder right now."""
        ...

    def close_sequence(self, seq_id: str, keep_tokens: int) -> ExportedKV:
        """End the sequence; return at most its first ``keep_tokens`` positions (fewer if
        the cache holds fewer) cut into blocks, one list per layer (a sliding layer only
        has the blocks its window reaches)."""
        ...

    def warm_up(self) -> None:
        """Run one forward pass so the first real request does not pay for it."""
        ...
