"""BlockPoolBatchEngine: continuous batching with per-request KV block accounting.

One ``step()`` is one round: apply cancellations (``Intake``), let the ``PrefillAdder``
plan the round's prefill (requests already prefilling first, then admissions from the
priority queue, each admitted by ``Admission``), and run the plan (``RoundExecutor``): one
batched decode step for every decoding request (a lone waiting prompt's chunk may ride its
forward pass), then the planned chunks that did not ride. ``Lifecycle`` takes tokens in and
ends requests; ``KVBooks`` keeps every block hold. ``submit`` and ``cancel`` may be called
from any thread; ``step`` runs on the engine thread only. The tensor work is the backend's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from semantic.application.books.kv_books import KVBooks, Reclaim
from semantic.application.engine.active_request import (
    ActiveRequest,
    GenerationRequest,
    HeldPrefix,
    Phase,
    StoredPrefix,
)
from semantic.application.engine.admission import Admission
from semantic.application.engine.events import EngineEvent, StepResult
from semantic.application.engine.intake import Intake
from semantic.application.engine.lifecycle import Lifecycle
from semantic.application.engine.prefix_sharing import PrefixSharing
from semantic.application.engine.rounds import RoundExecutor
from semantic.application.engine.state import EngineState
from semantic.application.scheduler.pacer import PacerConfig, PrefillPacer
from semantic.application.scheduler.prefill_adder import (
    PrefillAdder,
    RoundCapabilities,
    RoundPlan,
)
from semantic.application.scheduler.request_queue import RequestQueue
from semantic.domain.block_pool import BlockPool
from semantic.domain.blocks import AgentBlocks
from semantic.domain.constraints import OutputConstraint
from semantic.domain.generation import (
    GREEDY,
    CompletionCriteria,
    Priority,
    SamplingParams,
    check_logprobs,
)
from semantic.ports.grammar import Grammar, GrammarCompiler
from semantic.ports.model_backend import ModelBackend
from semantic.ports.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class EngineConfig:
    default_max_tokens: int = 512
    prefill_chunk_tokens: int = 256
    pacer: PacerConfig = field(default_factory=PacerConfig)
    max_running: int = 32
    max_waiting: int = 256
    forced_opening: bool = True
    """A constrained reply's opening that its grammar forces (``Grammar.opening``) is
    computed with the prompt, not a decode step a token (False: tests compare)."""


class BlockPoolBatchEngine:
    """``reclaim(n)`` is asked to free ``n`` pool blocks (by evicting idle cached KV) before
    a request is made to wait or ends for lack of memory. ``grammars`` compiles requests'
    output constraints (none: a constrained request is refused)."""

    def __init__(
        self,
        backend: ModelBackend,
        tokenizer: Tokenizer,
        pool: BlockPool,
        config: EngineConfig | None = None,
        *,
        reclaim: Reclaim | None = None,
        clock: Callable[[], float] = time.monotonic,
        grammars: GrammarCompiler | None = None,
    ) -> None:
        self._backend = backend
        self._capabilities = backend.capabilities  # read once: fixed for the backend's life
        self._spec = self._capabilities.spec
        self._config = config = config or EngineConfig()
        self._clock = clock
        self._books = books = KVBooks(pool, self._spec, reclaim=reclaim, clock=clock)
        self._queue: RequestQueue[ActiveRequest] = RequestQueue(config.max_waiting)
        self._running: dict[str, ActiveRequest] = {}
        sharing = PrefixSharing(self._spec)
        state = EngineState(self._queue, self._running, clock)
        self._lifecycle = lifecycle = Lifecycle(backend, books, sharing, state)
        self._intake = Intake(
            self._spec,
            tokenizer,
            books,
            lifecycle,
            state,
            grammars=grammars,
            forced_opening=config.forced_opening,
        )
        self._admission = Admission(backend, self._spec, books, sharing, lifecycle, state=state)
        self.pacer = PrefillPacer(config.pacer)
        self._adder = PrefillAdder(
            self._queue,
            books,
            self._spec,
            self.pacer,
            self._admission,
            chunk_tokens=config.prefill_chunk_tokens,
        )
        self._rounds = RoundExecutor(
            backend,
            self.pacer,
            adder=self._adder,
            admission=self._admission,
            lifecycle=lifecycle,
            state=state,
        )

    @property
    def pool(self) -> BlockPool:
        return self._books.pool

    @property
    def config(self) -> EngineConfig:
        return self._config

    def request(
        self,
        agent_id: str,
        prompt_tokens: Sequence[int],
        cached_blocks: AgentBlocks | HeldPrefix | None = None,
        *,
        max_tokens: int | None = None,
        sampling: SamplingParams = GREEDY,
        stop: Sequence[str] = (),
        criteria: CompletionCriteria | None = None,
        priority: Priority = Priority.NORMAL,
        namespace: str = "default",
        stored: StoredPrefix | None = None,
        constraint: OutputConstraint | None = None,
        logprobs: int | None = None,
    ) -> GenerationRequest:
        """A request with this engine's defaults (``max_tokens``: ``default_max_tokens``).
        ``cached_blocks`` are pinned from ``enqueue`` until admission; ``stored`` pins the
        stored prefix again if they were let go or fell short of it. A ``HeldPrefix`` (the
        cache lookup's) brings its match along, which is used as is. ``logprobs``: each
        token's log-probability with that many alternatives (``TokenEvent.logprob``)."""
        check_logprobs(logprobs)
        criteria = criteria or _criteria(
            max_tokens or self._config.default_max_tokens, tuple(stop), constraint
        )
        prompt = tuple(prompt_tokens)
        cached = (
            HeldPrefix.of(cached_blocks, prompt)
            if isinstance(cached_blocks, AgentBlocks)
            else cached_blocks
        )
        return GenerationRequest(
            agent_id,
            prompt,
            criteria,
            sampling,
            cached,
            priority,
            namespace,
            stored,
            constraint,
            logprobs,
        )

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
        logprobs: int | None = None,
    ) -> str:
        """``enqueue(request(...))``, for callers on the engine's own thread (tests)."""
        request = self.request(
            agent_id,
            prompt_tokens,
            cached_blocks,
            max_tokens=max_tokens,
            sampling=sampling,
            stop=stop,
            criteria=criteria,
            priority=priority,
            namespace=namespace,
            stored=stored,
            constraint=constraint,
            logprobs=logprobs,
        )
        return self.enqueue(request)

    def enqueue(self, request: GenerationRequest) -> str:
        """Queue ``request``; returns its id (``Intake.enqueue``)."""
        return self._intake.enqueue(request)

    def grammar_for(self, constraint: OutputConstraint | None) -> Grammar | None:
        """The constraint compiled, any thread (``Intake.grammar_for``)."""
        return self._intake.grammar_for(constraint)

    def cancel(self, request_id: str, failure: str | None = None) -> None:
        """Ask for a request to end at the next step (``Intake.cancel``)."""
        self._intake.cancel(request_id, failure)

    def release_blocks(self, request_id: str) -> None:
        """Drop the hold a completion's blocks still have under ``request_id``."""
        self._books.release_completion(request_id)

    def has_work(self) -> bool:
        return self._intake.cancels_pending() or bool(self._running) or len(self._queue) > 0

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        """Requests admitted and not finished (prefilling or decoding)."""
        return len(self._running)

    def step(self) -> StepResult:
        events: list[EngineEvent] = []
        started = self._clock()
        self._intake.apply_cancellations(events)
        self._rounds.run(self._plan(), events, started)
        prefilling = sum(1 for r in self._running.values() if r.phase is Phase.PREFILLING)
        decoding = self._lifecycle.decoding_count()
        return StepResult(events, decoding, prefilling, len(self._queue))

    def _plan(self) -> RoundPlan:
        running = sorted(self._running.values(), key=lambda r: r.phase is not Phase.PREFILLING)
        decoding = self._lifecycle.decoding_count()
        can_slice, ride = self._capabilities.can_slice, self._capabilities.ride_capacity(decoding)
        plan = self._adder.plan(
            running,
            decoding=decoding,
            room=self._config.max_running - len(self._running),
            capabilities=RoundCapabilities(can_slice, ride),
        )
        self._admission.release_copied()
        return plan


def _criteria(
    max_tokens: int, stop: tuple[str, ...], constraint: OutputConstraint | None
) -> CompletionCriteria:
    """A reply's tool calls lie out of its stop strings' reach (``stops_before``): they
    end its text, not a call's JSON; a reply that must call from its first character has
    no text for them to end."""
    if constraint is None or not constraint.calls:
        return CompletionCriteria(max_tokens=max_tokens, stop_strings=stop)
    if constraint.require_call:
        return CompletionCriteria(max_tokens=max_tokens)
    return CompletionCriteria(
        max_tokens=max_tokens, stop_strings=stop, stops_before=constraint.triggers
    )
