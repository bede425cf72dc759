"""The model backend port: the tensor work of prefill, batched decode and KV blocks.

The application decides what runs when (admission, chunk sizes, block accounting, when a
request ends); the backend only executes it, a round at a time: the engine hands it one
``RoundWork`` and takes in the ``RoundResult`` (ADR 0024). Sequences are named by the
caller's ids. ``StepOutput`` and ``SliceProgress`` are what a backend's own steps give
(``application/scheduler/round_runner.py``), inside an outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from semantic.domain.blocks import AgentBlocks
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.generation import SamplingParams, TokenLogprob
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
    logprob: TokenLogprob | None = None
    """Where the sequence asked for log-probabilities (``open_sequence``'s ``logprobs``)."""


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
    together: bool = False
    """Reported in the same step as the token before it (a run its grammar forced,
    ``GrammarMatcher.take_forced``): no gap between them."""
    logprob: TokenLogprob | None = None
    """Where the sequence asked for log-probabilities (it then takes no forced runs)."""


@dataclass(frozen=True, slots=True)
class PromptChunk:
    """Prompt tokens of one prefilling sequence, from ``position`` on; ``last``: the
    prompt's final chunk, whose first token is sampled."""

    seq_id: str
    tokens: tuple[int, ...]
    last: bool
    position: int = 0


@dataclass(frozen=True, slots=True)
class StepOutput:
    tokens: list[DecodedToken]
    first_token: SampledToken | None = None
    """The ridden chunk's first token, when it was its prompt's last chunk."""
    failed: dict[str, Exception] = field(default_factory=dict)
    """Sequences that could not join this step (their cache failed to build), by id: they
    are out of the batch, and only they fail; the others decoded as usual."""


@dataclass(frozen=True, slots=True)
class Join:
    """A sequence whose prompt is in joins the batched decoder before the round's step:
    ``first_token`` is fed next, then up to ``max_new_tokens`` more are made."""

    seq_id: str
    first_token: int
    max_new_tokens: int


@dataclass(frozen=True, slots=True)
class WholePrompts:
    """Whole prompts of fresh sequences (nothing restored, nothing prefilled), in as few
    forward passes as the backend can: a burst of short prompts pays a pass's fixed cost
    once. Should the shared pass fail, each prompt runs alone, so only a prompt that fails
    by itself fails."""

    prompts: tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True)
class SoFar:
    """The round so far, as a slice's time is reckoned from it."""

    elapsed: float | None
    """Seconds since the round began, once its decode step ran or was begun beside the
    slice; None if it had none."""
    step_seconds: float | None
    """The step's own time, when it ran before the slice (not beside it)."""
    decoding: int
    """Sequences in the decoder as the slice begins."""


@dataclass(frozen=True, slots=True)
class SlicedPrompt:
    """A prompt computed a part of the model at a time while the next part is expected to
    end within its time (``budget``, the engine's pacing rule, asked once as the slice
    begins), then stopped; the same chunk continues in a later round where it stopped. A
    chunk that ends early goes on into the next (``sizes``: this round's chunk, then the
    ones after it) while time is left: their first parts may wait for the next round."""

    seq_id: str
    tokens: tuple[int, ...]
    """The prompt from the chunk's start to its end."""
    sizes: tuple[int, ...]
    position: int
    budget: Callable[[SoFar], float]


PromptPart = WholePrompts | PromptChunk | SlicedPrompt


@dataclass(frozen=True, slots=True)
class RoundWork:
    """One round: the sequences that join the decoder, one batched decode step for every
    decoding sequence (``ride``: a chunk computed inside its forward pass), then the prompt
    parts in order. ``elapsed``: seconds of the round gone before the backend has it."""

    decode: bool
    joins: tuple[Join, ...] = ()
    ride: PromptChunk | None = None
    parts: tuple[PromptPart, ...] = ()
    elapsed: float = 0.0
    sliced: bool = False
    """Planned around a slice: where the backend can, its step runs beside the slice."""


@dataclass(frozen=True, slots=True)
class Stepped:
    """The decode step ran: its tokens (and the ride's first token, and the sequences that
    failed to join). ``beside``: it ran beside a slice, which makes its time not the
    streams' own pace; ``seconds`` is then None."""

    output: StepOutput
    seconds: float | None
    beside: bool = False


@dataclass(frozen=True, slots=True)
class StepFailed:
    """The decode step failed: every sequence it stepped fails (and the riding one)."""

    error: Exception
    beside: bool = False


@dataclass(frozen=True, slots=True)
class Prefilled:
    """Chunks computed in one pass of ``seconds`` (None: sliced, not timed as a pass), at
    ``position``; ``firsts``: each sequence's first token where its prompt ended."""

    chunks: tuple[tuple[str, int], ...]
    position: int
    seconds: float | None
    firsts: tuple[SampledToken | None, ...]


@dataclass(frozen=True, slots=True)
class InFlight:
    """A sliced chunk of ``tokens`` stopped part way through the layers."""

    seq_id: str
    tokens: int


@dataclass(frozen=True, slots=True)
class Failed:
    """A prompt part failed: only its sequence fails."""

    seq_id: str
    error: Exception


Outcome = Stepped | StepFailed | Prefilled | InFlight | Failed


@dataclass(frozen=True, slots=True)
class RoundResult:
    """What the round did, in the order it happened: the engine applies it afterwards.
    ``copied``: sequences that read their restored blocks in place until this round and
    hold a copy now (their blocks may be let go)."""

    outcomes: tuple[Outcome, ...]
    copied: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class BackendCapabilities:
    """What a backend is and can do, fixed when it is built: the engine reads it once,
    instead of asking mid-round."""

    spec: ModelCacheSpec
    model_id: str
    can_slice: bool = False
    """Whether a ``SlicedPrompt`` can stop inside the model (else its chunks run whole)."""
    ride_rows: int = 0
    """Rows a decode step's forward pass may hold, prompt tokens riding it included
    (0: a prompt chunk never rides, as on a model without the fused pass)."""

    def ride_capacity(self, decoding: int) -> int:
        """Prompt tokens that can ride a decode step of ``decoding`` sequences without
        changing any result (0 with nothing decoding: there is no step to ride)."""
        return max(0, self.ride_rows - decoding) if decoding else 0


class ModelBackend(Protocol):
    """Executes the engine's plan on a real model, one call a round.

    Lifecycle of a sequence: ``open_sequence`` (with restored blocks) -> its prompt in the
    rounds' parts -> it joins the decoder (``RoundWork.joins``) and decodes in each round's
    step until the engine decides it ends -> ``close_sequence`` (cuts the KV into blocks).
    ``close_sequence`` may be called at any stage, which is how cancellation works.
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
        logprobs: int | None = None,
    ) -> bool:
        """Create the sequence's cache from the first ``n_restored`` tokens of ``restored``,
        sized once for the ``n_new`` prompt tokens that will be prefilled after them.
        ``matcher``: every token sampled for the sequence (its first one too) is drawn from
        the tokens it allows, with the sampling settings applied among them, and told to
        it; free sequences in the same batch decode exactly as they would alone.
        ``logprobs``: every token comes with its log-probability and that many alternatives
        (``TokenLogprob``; None: none). True: the sequence reads the restored blocks where
        they lie (their memory is in use: keep them pinned) until a round reports it
        ``copied``."""
        ...

    def copy_prefix(self, source_id: str, target_id: str, n_tokens: int, room: int) -> bool:
        """Make the target's cache a copy of the source's first ``n_tokens`` positions
        (which the source has prefilled), with room for ``room`` more; False (nothing
        changed) where the source's cache cannot be copied so."""
        ...

    def run(self, work: RoundWork) -> RoundResult:
        """Run one round. A failure fails the sequences it touched, as an outcome; the
        backend decides itself whether the step can run beside a slice."""
        ...

    def close_sequence(self, seq_id: str, keep_tokens: int) -> ExportedKV:
        """End the sequence; return at most its first ``keep_tokens`` positions (fewer if
        the cache holds fewer) cut into blocks, one list per layer (a sliding layer only
        has the blocks its window reaches)."""
        ...
