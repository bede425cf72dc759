"""The engine's record of one request, from submission to completion."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from semantic.application.books.ledger import BlockLedger
from semantic.application.engine.completion import CompletionDetector
from semantic.domain.blocks import AgentBlocks
from semantic.domain.constraints import OutputConstraint
from semantic.domain.generation import CompletionCriteria, Priority, RequestStats, SamplingParams
from semantic.domain.tokens import common_prefix, reusable_prefix
from semantic.ports.grammar import Grammar


class Phase(Enum):
    WAITING = "waiting"
    PREFILLING = "prefilling"
    DECODING = "decoding"


@dataclass(frozen=True, slots=True)
class StoredPrefix:
    """A prompt's prefix the cache holds (in memory or on disk), to pin again later.

    A request pins its restored prefix from arrival to admission. When the pool is short,
    the engine lets waiting requests' pins go so the head can run; ``pin`` brings the
    prefix back at the request's own admission (from memory if it is still hot, else read
    again from disk), which costs a read instead of a prefill."""

    tokens: int
    """How many of the prompt's tokens the stored prefix covers."""
    pin: Callable[[str], AgentBlocks | None]
    """Pins the prefix under the given pool owner (blocking: reads files); the blocks, or
    None if none could be had. Stops at the first block that is gone or finds no room."""
    blocks_to_read: Callable[[], int] = field(default=lambda: 0)
    """How many pool blocks ``pin`` would now have to read from disk (the rest are hot)."""


@dataclass(frozen=True, slots=True)
class HeldPrefix:
    """Restored blocks pinned for a prompt, with how many of its tokens they match: found
    once, where the blocks are found (the cache lookup on the asyncio side, a leader's KV
    handed on, a stored prefix pinned again), and used as is by admission."""

    blocks: AgentBlocks
    matched: int
    """Leading prompt tokens ``blocks.token_ids`` share with the prompt."""

    @classmethod
    def of(cls, blocks: AgentBlocks, prompt: Sequence[int]) -> HeldPrefix:
        return cls(blocks, common_prefix(blocks.token_ids, prompt))


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What a caller asks the engine for; validated before it is queued."""

    agent_id: str
    prompt: tuple[int, ...]
    criteria: CompletionCriteria
    sampling: SamplingParams
    cached: HeldPrefix | None = None
    """The restored prefix pinned for it at arrival (``KVBooks.pin``)."""
    priority: Priority = Priority.NORMAL
    namespace: str = "default"
    stored: StoredPrefix | None = None
    constraint: OutputConstraint | None = None
    logprobs: int | None = None
    """Alternatives each generated token's log-probability comes with (``TokenLogprob``);
    None: no log-probabilities."""

    @property
    def continues_cached(self) -> bool:
        """Whether the prompt goes on from the end of its cached sequence (an agent coming
        back), rather than branching off part way (a new conversation that shares only a
        system prompt or a template's opening with one seen before)."""
        cached = self.cached
        return cached is not None and cached.matched >= cached.blocks.n_tokens


@dataclass(slots=True)
class ActiveRequest:
    id: str
    request: GenerationRequest
    detector: CompletionDetector
    reservation: BlockLedger
    submitted_at: float
    phase: Phase = Phase.WAITING
    n_cached: int = 0
    prefilled: int = 0
    in_flight: int = 0
    """Tokens of a chunk whose layers are partly computed (a sliced prefill): the next
    rounds continue that chunk, and ``prefilled`` counts it once it is whole."""
    admitted_at: float | None = None
    first_token_at: float | None = None
    pinned: bool = False
    """Whether the cached blocks are still held under ``pin_owner`` (until admission)."""
    short_of_room_since: float | None = None
    """When the head of the queue first found no room with nothing running."""
    following: str | None = None
    """The request whose prefill this one waits for, to copy the prefix they share."""
    grammar: Grammar | None = None
    """Its compiled output constraint: each admission starts a matcher from it."""
    dropped_tokens: int = 0
    """Cached prompt tokens its restore could not use (computed instead)."""
    opening: tuple[int, ...] = ()
    """The reply's first tokens, forced by its grammar: prefilled after the prompt, in its
    pass, and reported as output before the first sampled token."""
    prompt: tuple[int, ...] = field(init=False)
    """What its prefill computes: the request's prompt, then the reply's forced opening."""

    def __post_init__(self) -> None:
        self.prompt = self.request.prompt + self.opening if self.opening else self.request.prompt

    @property
    def pin_owner(self) -> str:
        return f"{self.id}/pin"

    @property
    def remaining_prompt(self) -> int:
        return len(self.prompt) - self.prefilled

    @property
    def new_tokens(self) -> int:
        """Prompt tokens its prefill will compute, as far as is known before admission."""
        request = self.request
        if request.cached is not None:
            known = len(request.cached.blocks.token_ids)
        else:
            known = request.stored.tokens if request.stored is not None else 0
        prompt = self.prompt
        return len(prompt) - reusable_prefix(known, len(prompt))

    def positions_after(self, generated: int) -> int:
        """Cache positions once ``generated`` tokens have been made (each is fed back)."""
        return len(self.request.prompt) + generated

    def stats(self, now: float) -> RequestStats:
        admitted = self.admitted_at if self.admitted_at is not None else now
        first = self.first_token_at if self.first_token_at is not None else now
        return RequestStats(
            queued_s=admitted - self.submitted_at,
            prefill_s=max(0.0, first - admitted),
            decode_s=max(0.0, now - first),
            # of the request's prompt, its last counted as computed (as without an opening)
            cached_tokens=min(self.n_cached, max(0, len(self.request.prompt) - 1)),
            computed_tokens=max(0, self.prefilled - self.n_cached),
            generated_tokens=self.detector.generated_count,
            dropped_tokens=self.dropped_tokens,
        )
