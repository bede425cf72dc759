"""Admission and chunking for one round, after mini-SGLang's PrefillAdder.

Requests already prefilling keep their place at the front and continue first, in priority
order; a prompt of a higher priority than every other request goes first and unpaced, as if
nothing decoded (a supervisor its workers wait on). New ones come from the queue in priority
order; each is admitted only if the pool, after what running
requests may still grow into (layer one), can also hold its prompt and its expected output
(layer two); availability is checked again once its cache is built and its shared blocks
pinned. Only prompt tokens not restored from cache count against the round's budget, and
chunks end on multiples of the chunk size so a warm prompt computes the same chunks a cold
one would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from semantic.application.books.kv_books import KVBooks
from semantic.application.engine.active_request import ActiveRequest
from semantic.application.scheduler.pacer import PrefillPacer, RoundBudget
from semantic.application.scheduler.request_queue import RequestQueue
from semantic.domain.cache_spec import ModelCacheSpec


class Admitter(Protocol):
    """Admission as the adder sees it (``engine.admission.Admission``)."""

    def admit(self, active: ActiveRequest) -> bool:
        """Reserve the prompt's blocks and build its cache; False if the pool cannot."""
        ...

    def undo(self, active: ActiveRequest) -> None:
        """Give back what ``admit`` took; the request stays queued."""
        ...


Plan = list[tuple[ActiveRequest, int]]


@dataclass(frozen=True, slots=True)
class RoundCapabilities:
    """What the backend can do for the round being planned."""

    can_slice: bool = False
    """Whether a chunk can stop between layers (``prefill_slice``)."""
    ride_capacity: int = 0
    """Prompt tokens the decode step's forward pass could carry (0: none)."""


@dataclass(frozen=True, slots=True)
class PlannedChunk:
    request: ActiveRequest
    tokens: int


@dataclass(frozen=True, slots=True)
class RoundPlan:
    """One round's prefill work: ``chunks`` run after the decode step, in order; ``ride``
    is computed inside the decode step's own forward pass instead; with ``slice_seconds``
    the round's one chunk is computed layer by layer for that long."""

    chunks: tuple[PlannedChunk, ...] = ()
    ride: PlannedChunk | None = None
    slice_seconds: float | None = None


@dataclass
class _Entry:
    """What admissions in one round may still take: requests, and blocks promised."""

    room: int
    promised: int
    busy: bool = False


@dataclass
class _Round:
    tokens: int
    seconds: float | None
    ride: bool = False
    """One chunk only: it is computed inside the decode step's forward pass."""
    sliced: bool = False
    """One chunk only: it is computed layer by layer, for the round's seconds."""

    def spend(self, tokens: int, seconds: float) -> None:
        self.tokens -= tokens
        if self.seconds is not None:
            self.seconds -= seconds

    @property
    def exhausted(self) -> bool:
        return self.tokens <= 0 or (self.seconds is not None and self.seconds <= 0)


class PrefillAdder:
    def __init__(
        self,
        queue: RequestQueue[ActiveRequest],
        books: KVBooks,
        spec: ModelCacheSpec,
        pacer: PrefillPacer,
        admission: Admitter,
        *,
        chunk_tokens: int,
    ) -> None:
        self._queue = queue
        self._books = books
        self._spec = spec
        self._pacer = pacer
        self._admission = admission
        self._chunk = chunk_tokens
        self._held_back = False
        """Whether the last round was short prompts' alone, long prefills waiting."""

    def plan(
        self,
        running: Sequence[ActiveRequest],
        decoding: int,
        room: int,
        capabilities: RoundCapabilities,
    ) -> RoundPlan:
        """This round's chunks: running prefills first, then admissions while budget and
        memory last; but a round with short prompts to prefill (new tokens within a chunk,
        queued or running) is theirs alone, so a long prompt part way through its prefill
        costs them a round, not its whole prefill (its next rounds are then paced beside
        their streams). Never two such rounds in a row: short arrivals cannot starve it.
        A prompt more urgent than every other request goes before all of them (``_urgent``).
        ``running`` are the admitted requests, prefilling ones in order; ``capabilities``:
        what the backend can do this round (slice, carry prompt tokens in a decode step)."""
        ride_capacity, can_slice = capabilities.ride_capacity, capabilities.can_slice
        prefilling = sorted((r for r in running if r.remaining_prompt > 0), key=_urgency)
        urgent = self._urgent(running, prefilling[:1])
        paced = 0 if urgent is not None else decoding  # as if nothing decoded
        waiting = len(self._queue) + len(prefilling)
        budget = self._pacer.round_budget(paced, waiting, ride_capacity, can_slice=can_slice)
        left = _Round(budget.tokens, budget.seconds, budget.ride, budget.sliced)
        promised = sum(self._still_needs(r, r.reservation.block_count) for r in running)
        entry = _Entry(room, promised, busy=bool(running))
        plan: Plan = []
        idle = paced == 0 and can_slice and self._pacer.config.idle_slice_seconds is not None
        if urgent is not None and urgent not in prefilling:
            plan = self._admit(entry, left, short_only=False)  # the queue's head: it first
        if prefilling and not self._held_back and urgent is None:
            plan = self._admit(entry, left, short_only=True)
            for request in prefilling:
                if self._short(request.remaining_prompt) and not left.exhausted:
                    plan += self._chunks(request, left)
            if plan:  # long prompts wait: this round's prefill comes before the first tokens
                self._held_back = True
                return self._settle(plan, budget, ride_capacity, idle)
        self._held_back = False
        for request in prefilling:
            if not left.exhausted:
                plan += self._chunks(request, left)
        if not (idle and self._one_long_prompt(plan)):
            plan += self._admit(entry, left, short_only=False)
        return self._settle(plan, budget, ride_capacity, idle)

    def _urgent(
        self, running: Sequence[ActiveRequest], first_prefilling: Sequence[ActiveRequest]
    ) -> ActiveRequest | None:
        """The prompt (prefilling, else the queue's head) of a higher priority than every
        other request, running or queued, if there is one: it goes first, unpaced (big
        chunks, sliced as in an idle round) and is never held back for short prompts. The
        streams it passes still take a token a round. The prompt a framework marks urgent
        is one others wait on (a supervisor whose workers start when it answers)."""
        head = self._queue.peek()
        candidates = [*first_prefilling, *([head] if head is not None else [])]
        if not candidates:
            return None
        first = min(candidates, key=_urgency)
        others = [r for r in (*running, *self._queue.items()) if r is not first]
        return first if all(_urgency(first) < _urgency(r) for r in others) else None

    def _one_long_prompt(self, plan: Plan) -> bool:
        """Whether the plan is chunks of one prompt of more than a chunk of new tokens (its
        last chunk included: at 4,000 tokens of context one takes ~1 s)."""
        return (
            bool(plan)
            and all(request is plan[0][0] for request, _ in plan)
            and not self._short(plan[0][0].new_tokens)
        )

    def _settle(self, plan: Plan, budget: RoundBudget, ride_capacity: int, idle: bool) -> RoundPlan:
        """Whether the plan's one chunk rides the decode step or is sliced. ``idle``: nothing
        decodes and idle rounds may be sliced."""
        if idle and self._one_long_prompt(plan):
            # the others wait behind it anyway: sliced, the round ends within its time and
            # a short arrival is let in then, not after a whole pass
            first = PlannedChunk(*plan[0])
            return RoundPlan((first,), None, self._pacer.config.idle_slice_seconds)
        one = plan[0] if len(plan) == 1 else None
        fits = one is not None and not one[0].in_flight and one[1] <= ride_capacity
        # in a sliced round, a chunk that rides cheaply does: one shared pass beats steps
        # spread over rounds (a returning agent's short turn)
        cheap = (
            one is not None and budget.sliced and self._pacer.ride_fits(one[1], one[0].prefilled)
        )
        if fits and (budget.ride or cheap) and one is not None:
            return RoundPlan((), PlannedChunk(*one), None)
        sliced = budget.sliced and one is not None
        chunks = tuple(PlannedChunk(a, n) for a, n in plan)
        return RoundPlan(chunks, None, budget.seconds if sliced else None)

    def _admit(self, entry: _Entry, left: _Round, *, short_only: bool) -> Plan:
        """Admit queued requests in priority order while budget and memory last; with
        ``short_only``, those whose new tokens fit in a chunk, past long ones queued ahead
        (which this round would not have admitted: the long prompt prefilling takes it)."""
        plan: Plan = []
        queued = self._queue.items() if short_only else []
        shorts = iter([c for c in queued if self._short(c.new_tokens)])
        while entry.room > 0 and not left.exhausted:
            candidate = next(shorts, None) if short_only else self._queue.peek()
            if candidate is None:
                break
            prompt_blocks = self._spec.blocks_for_tokens(len(candidate.prompt))
            output_blocks = self._still_needs(candidate, prompt_blocks)
            if entry.busy and not self._books.fits(entry.promised + output_blocks + prompt_blocks):
                break  # wait: memory promised to running requests is not handed out
            if not self._admission.admit(candidate):
                break
            if entry.busy and not self._books.fits(entry.promised + output_blocks):
                self._admission.undo(
                    candidate
                )  # pinning changed what is free; try again next round
                break
            self._queue.cancel(candidate.id)
            entry.promised += output_blocks
            entry.busy = True
            entry.room -= 1
            plan += self._chunks(candidate, left)
        return plan

    def _short(self, new_tokens: int) -> bool:
        """A prompt whose new tokens fit one chunk: a returning agent's turn, a short
        question. It goes before a long prompt's next chunk, which it delays by at most a
        chunk, where waiting behind that prompt could cost its whole prefill."""
        return new_tokens <= self._chunk

    def _chunks(self, request: ActiveRequest, left: _Round) -> Plan:
        if request.following is not None:  # it copies its leader's prefix first
            return []
        if request.in_flight:  # a sliced chunk carries on as it began
            left.spend(request.in_flight, 0.0)
            if left.sliced:
                left.tokens = 0
            return [(request, request.in_flight)]
        out: Plan = []
        position, end = request.prefilled, len(request.prompt)
        while position < end and not left.exhausted:
            n = self._chunk_at(position, end, left.tokens)
            if left.seconds is not None and not left.sliced:
                paced = self._pacer.tokens_within(left.seconds, position, ride=left.ride)
                config = self._pacer.config
                n = min(n, max(paced, config.ride_min_tokens if left.ride else config.min_tokens))
            if n <= 0:
                break
            left.spend(n, self._pacer.cost(n, position, ride=left.ride))
            out.append((request, n))
            position += n
            if left.ride or left.sliced:
                left.tokens = 0  # the round's one chunk
        return out

    def slice_sizes(self, position: int, end: int, first: int) -> tuple[int, ...]:
        """A sliced prompt's chunk this round (``first`` tokens from ``position``), then the
        chunks after it to the prompt's ``end``, as its next sliced rounds would plan them:
        a round whose chunk ends early goes on with the next in the time it has left."""
        sizes, position = [first], position + first
        while position < end:
            sizes.append(self._chunk_at(position, end, self._pacer.config.slice_tokens))
            position += sizes[-1]
        return tuple(sizes)

    def _chunk_at(self, position: int, end: int, limit: int) -> int:
        """Tokens from ``position`` up to the next chunk boundary, the prompt's end or
        ``limit``: the boundaries depend on the prompt alone, so its KV's bits do too."""
        boundary = (position // self._chunk + 1) * self._chunk
        return min(boundary - position, end - position, limit)

    def _still_needs(self, request: ActiveRequest, held: int) -> int:
        """Blocks ``request`` may still claim, up to its prompt plus its max tokens."""
        limit = len(request.request.prompt) + request.request.criteria.max_tokens
        return max(0, self._spec.blocks_for_tokens(limit) - held)


def _urgency(request: ActiveRequest) -> int:
    """Lower first: a request's queue priority (``X-Priority``)."""
    return int(request.request.priority)
