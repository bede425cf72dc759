"""BlockPoolBatchEngine: continuous batching with per-request KV block accounting.

One ``step()`` is one round: apply cancellations, let the ``PrefillAdder`` plan the round's
prefill budget (requests already prefilling first, then admissions from the priority queue),
run one batched decode step for every decoding request (a lone waiting prompt's chunk may
ride its forward pass), then the planned chunks that did not ride. ``submit`` and ``cancel``
may be called from any thread; ``step`` runs on the engine thread only. The tensor work is
the backend's; this class decides what runs, keeps the block books, and reports events.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from semantic.application.active_request import (
    ActiveRequest,
    GenerationRequest,
    Phase,
    StoredPrefix,
)
from semantic.application.completion import CompletionDetector
from semantic.application.events import CompletionEvent, EngineEvent, TokenEvent
from semantic.application.prefix_pins import PrefixPins
from semantic.application.prefix_sharing import PrefixSharing
from semantic.application.request_validation import validate_request
from semantic.application.reservation import BlockReservation
from semantic.application.scheduler.pacer import PacerConfig, PrefillPacer
from semantic.application.scheduler.prefill_adder import Plan, PrefillAdder
from semantic.application.scheduler.request_queue import RequestQueue
from semantic.domain.block_pool import BlockPool
from semantic.domain.blocks import AgentBlocks, restorable_prefix
from semantic.domain.constraints import OutputConstraint
from semantic.domain.errors import InvalidRequestError, NoRoomCameError
from semantic.domain.generation import (
    GREEDY,
    CompletionCriteria,
    FinishReason,
    Priority,
    SamplingParams,
)
from semantic.domain.tokens import common_prefix, reusable_prefix
from semantic.ports.grammar import Grammar, GrammarCompiler
from semantic.ports.model_backend import ModelBackend, PromptChunk, SampledToken, StepOutput
from semantic.ports.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    default_max_tokens: int = 512
    max_context: int = 8192
    prefill_chunk_tokens: int = 256
    pacer: PacerConfig = field(default_factory=PacerConfig)
    max_running: int = 32
    max_waiting: int = 256


@dataclass(frozen=True, slots=True)
class StepResult:
    events: list[EngineEvent]
    decoding: int
    prefilling: int
    waiting: int


NO_ROOM_PATIENCE_S = 30.0
"""How long the head of the queue waits, with nothing running, for memory held elsewhere
(finished requests' KV on its way to disk) before it is refused, so that a hold that never
ends (a save hung on a dead disk) leaves a 429 to retry, not a request that never answers."""
NO_ROOM_FAILURE = f"no KV memory came free within {NO_ROOM_PATIENCE_S:.0f} s with nothing running"


class BlockPoolBatchEngine:
    def __init__(
        self,
        backend: ModelBackend,
        tokenizer: Tokenizer,
        pool: BlockPool,
        config: EngineConfig | None = None,
        *,
        reclaim: Callable[[int], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        grammars: GrammarCompiler | None = None,
    ) -> None:
        """``reclaim(n)`` is asked to free ``n`` pool blocks (by evicting idle cached KV)
        before a request is made to wait or ends for lack of memory. ``grammars`` compiles
        requests' output constraints (none: a constrained request is refused)."""
        self._backend = backend
        self._grammars = grammars
        self._tokenizer = tokenizer
        self._pool = pool
        self._spec = backend.spec
        self._config = config or EngineConfig()
        self._clock = clock
        self._reclaim = reclaim
        self._pins = PrefixPins(pool, self._spec, reclaim, clock)
        self._sharing = PrefixSharing(self._spec)
        self._ids = itertools.count(1)
        self._cancels: dict[str, str | None] = {}  # request id -> why, if it failed
        self._cancel_lock = threading.Lock()
        self._queue: RequestQueue[ActiveRequest] = RequestQueue(self._config.max_waiting)
        self._running: dict[str, ActiveRequest] = {}
        self._failed_admissions: list[tuple[ActiveRequest, Exception]] = []
        self._round_started = 0.0
        self._stepped = False
        """Whether this round's decode step ran (or was begun beside its slice): its slice
        has what is left of the round."""
        self._beside: list[ActiveRequest] = []
        """The requests a decode step begun beside the slice is stepping."""
        self.pacer = PrefillPacer(self._config.pacer)
        self._adder = PrefillAdder(
            self._queue,
            pool,
            self._spec,
            self.pacer,
            chunk_tokens=self._config.prefill_chunk_tokens,
            reclaim=reclaim,
        )

    @property
    def pool(self) -> BlockPool:
        return self._pool

    @property
    def config(self) -> EngineConfig:
        return self._config

    def submit(
        self,
        agent_id: str,
        prompt_tokens: Sequence[int],
        cached_blocks: AgentBlocks | None = None,
        *,
        max_tokens: int | None = None,
        sampling: SamplingParams = GREEDY,
        stop: Sequence[str] = (),
        criteria: CompletionCriteria | None = None,
        priority: Priority = Priority.NORMAL,
        namespace: str = "default",
        stored: StoredPrefix | None = None,
        constraint: OutputConstraint | None = None,
    ) -> str:
        """Queue a request; returns its id. Raises domain errors for bad input and
        ``QueueFullError`` when the queue is at its bound. ``cached_blocks`` are pinned
        until admission; ``stored`` pins the stored prefix again if they were let go or
        fell short of it. ``constraint`` is compiled here, so a schema the grammar engine
        cannot honour is refused (``UnsupportedSchemaError``) before any work."""
        criteria = criteria or CompletionCriteria(
            max_tokens=max_tokens or self._config.default_max_tokens, stop_strings=tuple(stop)
        )
        request = GenerationRequest(
            agent_id,
            tuple(prompt_tokens),
            criteria,
            sampling,
            cached_blocks,
            priority,
            namespace,
            stored,
            constraint,
        )
        validate_request(request, self._spec, self._pool, self._tokenizer, self._config.max_context)
        grammar = self.grammar_for(constraint)
        request_id = f"req-{next(self._ids)}"
        active = ActiveRequest(
            request_id,
            request,
            CompletionDetector(self._tokenizer, criteria, self._tokenizer.eos_token_ids),
            BlockReservation(self._pool, self._spec, request_id),
            submitted_at=self._clock(),
            grammar=grammar,
        )
        if cached_blocks is not None:  # pin: hot blocks stay put until admission copies them
            self._pins.pin(active, cached_blocks)
        try:
            self._queue.put(request_id, active, priority)
        except Exception:
            self._pool.release_owner(active.pin_owner)
            raise
        return request_id

    def grammar_for(self, constraint: OutputConstraint | None) -> Grammar | None:
        """The constraint compiled (None for none); any thread. Compiled grammars are
        cached, so a caller that compiles first, off the event loop and outside the engine
        loop's lock, makes ``submit``'s own compile a cache hit."""
        if constraint is None:
            return None
        if self._grammars is None:
            raise InvalidRequestError("this server was started without constrained decoding")
        return self._grammars.compile(constraint)

    def cancel(self, request_id: str, failure: str | None = None) -> None:
        """Ask for a request to end at the next step; unknown ids are ignored. With a
        ``failure`` it ends as failed, with that reason (its caller still reads a reply:
        a stream then ends with an error, not as if the reply were whole)."""
        with self._cancel_lock:
            self._cancels[request_id] = failure

    def release_blocks(self, request_id: str) -> None:
        """Drop the hold a completion's blocks still have under ``request_id``."""
        self._pool.release_owner(request_id)

    def has_work(self) -> bool:
        with self._cancel_lock:
            cancels = bool(self._cancels)
        return cancels or bool(self._running) or len(self._queue) > 0

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        """Requests admitted and not finished (prefilling or decoding)."""
        return len(self._running)

    def step(self) -> StepResult:
        events: list[EngineEvent] = []
        self._round_started = self._clock()
        self._stepped = False
        self._apply_cancellations(events)
        plan = self._plan()
        ride = plan.pop() if self._adder.rides else None
        beside = ride is None and self._begin_decode_beside_slice(events)
        if not beside:
            self._decode(events, ride, plain=not plan and ride is None)
        try:
            self._prefill(plan, events)
        finally:
            if beside:
                self._end_decode_beside_slice(events)
        prefilling = sum(1 for r in self._running.values() if r.phase is Phase.PREFILLING)
        return StepResult(events, self._backend.decoding_count, prefilling, len(self._queue))

    def _apply_cancellations(self, events: list[EngineEvent]) -> None:
        with self._cancel_lock:
            cancels, self._cancels = self._cancels, {}
        for request_id, failure in cancels.items():
            queued = self._queue.cancel(request_id)
            active = queued or self._running.get(request_id)
            if active is not None:
                active.detector.end(
                    FinishReason.CANCELLED if failure is None else FinishReason.ERROR
                )
                keep = active.phase is Phase.DECODING
                self._complete(active, events, keep_kv=keep, error=failure)

    def _plan(self) -> Plan:
        running = sorted(self._running.values(), key=lambda r: r.phase is not Phase.PREFILLING)
        plan = self._adder.plan(
            running,
            decoding=self._backend.decoding_count,
            room=self._config.max_running - len(self._running),
            admit=self._admit,
            undo=self._undo,
            ride_capacity=self._backend.ride_capacity(),
            can_slice=self._backend.can_slice,
        )
        for active in self._running.values():
            if active.request.cached is not None and not self._backend.reads_restored(active.id):
                self._pins.copied(active)
        return plan

    def _decode(
        self, events: list[EngineEvent], ride: tuple[ActiveRequest, int] | None, plain: bool
    ) -> None:
        batch = self._backend.decoding_count
        if batch == 0:
            self.pacer.observe_idle()
            return
        chunk = None
        if ride is not None:
            active, n = ride
            tokens = active.prompt[active.prefilled : active.prefilled + n]
            chunk = PromptChunk(active.id, tokens, active.prefilled + n == len(active.prompt))
        started = self._clock()
        try:
            output = self._backend.decode_step(chunk)
        except Exception as error:  # noqa: BLE001 - a failed step fails its requests, not the server
            self._fail_decoding(error, events)
            if ride is not None:
                self._fail(ride[0], error, events)
            return
        elapsed = self._clock() - started
        if ride is None:
            self.pacer.observe_decode(elapsed, batch=batch, plain=plain)
            self._stepped = True
        else:
            added = elapsed - self.pacer.decode_seconds
            self.pacer.observe_prefill(ride[1], ride[0].prefilled, added, ride=True)
        self._take_output(output, events)
        if ride is not None:
            self._chunk_done(ride[0], ride[1], output.first_token, events)

    def _begin_decode_beside_slice(self, events: list[EngineEvent]) -> bool:
        """Whether this round's decode step was begun beside its slice (the backend runs it
        on another core while the slice goes on). Its time is not the streams' pace, so
        the pacer does not see it; the slice has the whole round. Should beginning it
        fail, the requests it would step fail, and the round goes on without them."""
        if self._adder.slice_seconds is None or not self._backend.decoding_count:
            return False
        stepping = self._decoding()
        try:
            begun = self._backend.begin_decode_step()
        except Exception as error:  # noqa: BLE001 - a failed step fails its requests, not the server
            self._fail_decoding(error, events)
            return False
        self._stepped, self._beside = begun, stepping
        return begun

    def _end_decode_beside_slice(self, events: list[EngineEvent]) -> None:
        """The step's tokens; should it fail, it fails the requests it was stepping (not a
        prompt that got its first token beside it)."""
        stepping, self._beside = self._beside, []
        try:
            output = self._backend.end_decode_step()
        except Exception as error:  # noqa: BLE001 - a failed step fails its requests, not the server
            self._fail_decoding(error, events, stepping)
            return
        self._take_output(output, events)

    def _decoding(self) -> list[ActiveRequest]:
        return [r for r in self._running.values() if r.phase is Phase.DECODING]

    def _fail_decoding(
        self,
        error: Exception,
        events: list[EngineEvent],
        stepping: list[ActiveRequest] | None = None,
    ) -> None:
        for active in self._decoding() if stepping is None else stepping:
            if active.id in self._running:
                self._fail(active, error, events)

    def _take_output(self, output: StepOutput, events: list[EngineEvent]) -> None:
        for seq_id, join_error in output.failed.items():
            joining = self._running.get(seq_id)
            if joining is not None:
                self._fail(joining, join_error, events)
        for token in output.tokens:
            owner = self._running.get(token.seq_id)
            if owner is not None:
                self._accept_token(owner, token.token, token.top_prob, events)

    def _prefill(self, plan: Plan, events: list[EngineEvent]) -> None:
        whole = [
            (a, n) for a, n in plan if a.prefilled == 0 and n == len(a.prompt) and not a.in_flight
        ]
        if len(whole) > 1:
            self._prefill_whole_prompts([a for a, _ in whole], events)
            batched = {a.id for a, _ in whole}
            plan = [(a, n) for a, n in plan if a.id not in batched]
        for active, n_tokens in plan:
            if active.id in self._running:  # an earlier chunk may have failed it
                self._prefill_chunk(active, n_tokens, events)
        for active, error in self._failed_admissions:
            self._fail(active, error, events)
        self._failed_admissions.clear()

    def _admit(self, active: ActiveRequest) -> bool:
        """Reserve blocks and build the cache for a queued request; False if it must wait."""
        prompt = active.prompt
        self._pins.pin_again(active)
        if not self._grow(active, len(prompt)) and not self._make_room(active):
            return False
        cached = active.request.cached
        matched = common_prefix(cached.token_ids, prompt) if cached is not None else 0
        n_cached = reusable_prefix(matched, len(prompt))
        try:
            n_cached = self._open(active, cached, n_cached)
        except Exception as error:  # noqa: BLE001 - this request fails; the queue moves on
            active.reservation.release()
            self._queue.cancel(active.id)
            self._failed_admissions.append((active, error))
            return False
        active.phase = Phase.PREFILLING
        active.n_cached = active.prefilled = n_cached
        active.admitted_at = self._clock()
        self._running[active.id] = active
        leader = self._sharing.follow(active, self._running.values())
        if leader is not None:
            self._copy_to_followers(self._running[leader])
        return True

    def _open(self, active: ActiveRequest, cached: AgentBlocks | None, n_cached: int) -> int:
        """Open the request's sequence on the longest prefix of ``n_cached`` its blocks can
        restore; returns that length. A restore the backend cannot build is dropped and the
        prompt computed instead (``dropped_tokens``): a stored prefix that cannot serve
        this prompt must not fail it, nor every later prompt that finds it."""
        usable = restorable_prefix(cached, n_cached, self._spec) if cached is not None else 0
        if usable:
            try:
                self._open_sequence(active, cached, usable)
            except Exception:  # computed instead, below
                log.warning(
                    "%s: its %d cached tokens could not be restored; computing them",
                    active.id,
                    usable,
                    exc_info=True,
                )
                usable = 0
        if not usable:
            self._open_sequence(active, None, 0)
        active.dropped_tokens = n_cached - usable
        return usable

    def _open_sequence(self, active: ActiveRequest, cached: AgentBlocks | None, n: int) -> None:
        grammar = active.grammar  # a fresh matcher for each try: a failed one may have begun
        constrained = {"matcher": grammar.matcher()} if grammar is not None else {}
        self._backend.open_sequence(
            active.id,
            restored=cached,
            n_restored=n,
            n_new=len(active.prompt) - n,
            sampling=active.request.sampling,
            track_top_prob=active.request.criteria.min_top_prob is not None,
            **constrained,
        )

    def _make_room(self, active: ActiveRequest) -> bool:
        if self._running:  # a request that ends will free memory: wait for it
            active.short_of_room_since = None
            return False
        items = self._queue.items()
        if self._pins.make_room(active, items, lambda: self._grow(active, len(active.prompt))):
            return True
        self._refuse_if_no_room_comes(active)
        return False

    def _refuse_if_no_room_comes(self, active: ActiveRequest) -> None:
        since = active.short_of_room_since
        if since is None:
            active.short_of_room_since = self._clock()
        elif self._clock() - since >= NO_ROOM_PATIENCE_S:
            active.reservation.release()
            self._queue.cancel(active.id)
            self._failed_admissions.append((active, NoRoomCameError(NO_ROOM_FAILURE)))

    def _undo(self, active: ActiveRequest) -> None:
        self._sharing.end(active)
        self._backend.close_sequence(active.id, 0)
        active.reservation.release()
        active.phase = Phase.WAITING
        active.admitted_at = None
        del self._running[active.id]

    def _prefill_chunk(self, active: ActiveRequest, n: int, events: list[EngineEvent]) -> None:
        seconds = self._adder.slice_seconds
        batch = self._backend.decoding_count
        if active.in_flight and seconds is None:
            # a chunk part way through goes on at a slice's pace while streams decode,
            # else at once
            seconds = (self.pacer.slice_seconds(batch) if batch else None) or math.inf
        if seconds is not None:
            if self._stepped and math.isfinite(seconds):
                elapsed = self._clock() - self._round_started
                seconds = self.pacer.slice_in_round(seconds, elapsed, batch)
            self._prefill_slice(active, n, seconds, events)
            return
        chunk = active.prompt[active.prefilled : active.prefilled + n]
        first: SampledToken | None = None
        started = self._clock()
        try:
            if active.prefilled + n < len(active.prompt):
                self._backend.prefill(active.id, chunk)
            else:
                first = self._backend.prefill_and_sample(active.id, chunk)
        except Exception as error:  # noqa: BLE001 - one failed prompt must not fail the others
            self._fail(active, error, events)
            return
        self.pacer.observe_prefill(n, active.prefilled, self._clock() - started)
        self._chunk_done(active, n, first, events)

    def _prefill_slice(
        self, active: ActiveRequest, n: int, seconds: float, events: list[EngineEvent]
    ) -> None:
        """Some of a chunk's layers; the chunk counts as prefilled once all have it. A chunk
        that ends before the slice's time does goes on into the next chunk, whose first
        steps may wait for the next round: an ended chunk left ~0.4 s of a 4,000-token
        prompt's slices unused beside four streams."""
        deadline = self._clock() + seconds
        first = True
        while self._slice_chunk(active, n, seconds, events, first=first):
            seconds = deadline - self._clock()
            if not (math.isfinite(seconds) and seconds > 0 and active.remaining_prompt > 0):
                return
            n, first = self._adder.next_slice(active), False

    def _slice_chunk(
        self,
        active: ActiveRequest,
        n: int,
        seconds: float,
        events: list[EngineEvent],
        *,
        first: bool,
    ) -> bool:
        """Whether the chunk was finished (and the request still runs)."""
        chunk = active.prompt[active.prefilled : active.prefilled + n]
        last = active.prefilled + n == len(active.prompt)
        try:
            progress = self._backend.prefill_slice(
                active.id, chunk, seconds, last=last, must_progress=first
            )
        except Exception as error:  # noqa: BLE001 - one failed prompt must not fail the others
            self._fail(active, error, events)
            return False
        active.in_flight = 0 if progress.done else n
        if progress.done:
            self._chunk_done(active, n, progress.first_token, events)
        return progress.done and active.id in self._running

    def _chunk_done(
        self, active: ActiveRequest, n: int, first: SampledToken | None, events: list[EngineEvent]
    ) -> None:
        active.prefilled += n
        self._copy_to_followers(active)
        if active.prefilled == len(active.prompt) and first is not None:
            self._first_token(active, first, events)

    def _copy_to_followers(self, leader: ActiveRequest) -> None:
        """Requests waiting for a prefix ``leader`` now holds start from a copy of it
        (``PrefixSharing``); one whose copy cannot be made prefills it itself."""
        for follower in self._sharing.ready(leader):
            active, shared = follower.request, follower.shared
            room = len(active.prompt) - shared
            try:
                copied = self._backend.copy_prefix(leader.id, active.id, shared, room)
            except Exception:  # noqa: BLE001 - it computes the prefix itself instead
                copied = False
            if copied:
                active.n_cached = active.prefilled = shared

    def _prefill_whole_prompts(self, batch: list[ActiveRequest], events: list[EngineEvent]) -> None:
        """Fresh prompts that fit this round whole share one forward pass; if it fails, each
        runs alone, so only a prompt that fails by itself fails."""
        started = self._clock()
        try:
            firsts = self._backend.prefill_many_and_sample([(a.id, a.prompt) for a in batch])
        except Exception:  # noqa: BLE001 - retried one by one below, where errors are reported
            for active in batch:
                if active.id in self._running:
                    self._prefill_chunk(active, len(active.prompt), events)
            return
        self.pacer.observe_prefill(sum(len(a.prompt) for a in batch), 0, self._clock() - started)
        for active, first in zip(batch, firsts, strict=True):
            active.prefilled = len(active.prompt)
            self._copy_to_followers(active)
            self._first_token(active, first, events)

    def _first_token(
        self, active: ActiveRequest, first: SampledToken, events: list[EngineEvent]
    ) -> None:
        active.first_token_at = self._clock()
        active.phase = Phase.DECODING
        self._accept_token(active, first.token, first.top_prob, events)
        if active.id in self._running:
            remaining = active.request.criteria.max_tokens - 1
            self._backend.start_decoding(active.id, first.token, remaining)

    def _accept_token(
        self, active: ActiveRequest, token: int, top_prob: float | None, events: list[EngineEvent]
    ) -> None:
        generated = active.detector.generated_count + 1
        if not self._grow(active, active.positions_after(generated)):
            active.detector.end(FinishReason.POOL_EXHAUSTED)
            self._complete(active, events, keep_kv=True)
            return
        progress = active.detector.add(token, top_prob)
        events.append(TokenEvent(active.id, token, progress.text))
        if progress.finish is not None:
            self._complete(active, events, keep_kv=True)

    def _grow(self, active: ActiveRequest, n_positions: int) -> bool:
        if active.reservation.grow_to(n_positions):
            return True
        if self._reclaim is None:
            return False
        self._reclaim(active.reservation.shortfall(n_positions))
        return active.reservation.grow_to(n_positions)

    def _fail(self, active: ActiveRequest, error: Exception, events: list[EngineEvent]) -> None:
        """The request ends as failed; an error from inside the engine (not a refusal for
        want of memory) is logged with its traceback, under the request's id."""
        active.detector.end(FinishReason.ERROR)
        reason = str(error) if isinstance(error, NoRoomCameError) else None
        if reason is None:
            log.error("%s failed: %s", active.id, error, exc_info=error)
        reason = reason or f"{type(error).__name__}: {error}"
        self._complete(active, events, keep_kv=False, error=reason)

    def _complete(
        self,
        active: ActiveRequest,
        events: list[EngineEvent],
        *,
        keep_kv: bool,
        error: str | None = None,
    ) -> None:
        self._running.pop(active.id, None)
        self._sharing.end(active)
        kept = active.detector.kept_tokens
        blocks = None
        if active.pinned:
            self._pins.release(active)
        if active.phase is not Phase.WAITING:
            keep = active.positions_after(len(kept)) if keep_kv else 0
            try:
                exported = self._backend.close_sequence(active.id, keep)
            except Exception as close_error:  # the request is over either way
                log.error("%s: its cache could not be kept", active.id, exc_info=close_error)
                error = error or f"{type(close_error).__name__}: {close_error}"
                exported = None
            if exported is not None and exported.n_tokens > 0:
                token_ids = (active.prompt + tuple(kept))[: exported.n_tokens]
                layers = active.reservation.bind(exported)
                blocks = AgentBlocks(active.request.agent_id, token_ids, layers)
                self._hand_on(active, blocks)
            else:
                active.reservation.release()
        events.append(self._completion(active, kept, blocks, error))

    def _hand_on(self, active: ActiveRequest, blocks: AgentBlocks) -> None:
        """Queued requests that share a prefix with ``active`` pin the KV it leaves
        (``PrefixSharing.heirs``), unless it ended cancelled or failed (the cache keeps no
        trace of those either)."""
        if active.detector.reason in (FinishReason.CANCELLED, FinishReason.ERROR):
            return
        for heir, shared in self._sharing.heirs(active, blocks, self._queue.items()):
            self._pins.pin_instead(heir, shared)

    def _completion(
        self,
        active: ActiveRequest,
        kept: list[int],
        blocks: AgentBlocks | None,
        error: str | None,
    ) -> CompletionEvent:
        return CompletionEvent(
            request_id=active.id,
            agent_id=active.request.agent_id,
            namespace=active.request.namespace,
            finish_reason=active.detector.reason or FinishReason.ERROR,
            text=active.detector.text,
            token_ids=tuple(kept),
            prompt_tokens=len(active.prompt),
            blocks=blocks,
            stats=active.stats(self._clock()),
            error=error,
            stop_string=active.detector.stop_string,
        )
