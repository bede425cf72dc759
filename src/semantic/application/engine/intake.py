"""Intake and cancellation: requests queued, cancels applied between rounds.

``enqueue`` and ``cancel`` may be called from any thread; ``apply_cancellations`` runs on
the engine thread at the start of each round. A request's restored prefix is pinned as
it is queued (``KVBooks.pin``), so hot blocks stay put until admission copies them.
"""

from __future__ import annotations

import itertools
import threading

from semantic.application.books.kv_books import KVBooks
from semantic.application.engine.active_request import ActiveRequest, GenerationRequest, Phase
from semantic.application.engine.completion import CompletionDetector
from semantic.application.engine.lifecycle import Events, Lifecycle
from semantic.application.engine.state import EngineState
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.constraints import OutputConstraint
from semantic.domain.errors import InvalidRequestError
from semantic.domain.generation import FinishReason
from semantic.ports.grammar import Grammar, GrammarCompiler
from semantic.ports.tokenizer import Tokenizer


class Intake:
    def __init__(
        self,
        spec: ModelCacheSpec,
        tokenizer: Tokenizer,
        books: KVBooks,
        lifecycle: Lifecycle,
        state: EngineState,
        *,
        grammars: GrammarCompiler | None,
        forced_opening: bool = True,
    ) -> None:
        self._spec = spec
        self._tokenizer = tokenizer
        self._books = books
        self._lifecycle = lifecycle
        self._queue = state.queue
        self._running = state.running
        self._clock = state.clock
        self._grammars = grammars
        self._forced_opening = forced_opening
        self._ids = itertools.count(1)
        self._cancels: dict[str, str | None] = {}  # request id -> why, if it failed
        self._cancel_lock = threading.Lock()

    def enqueue(self, request: GenerationRequest) -> str:
        """Queue a request; returns its id. Raises ``QueueFullError`` when the queue is at
        its bound; the request's own checks ran before (``chat/request_validation``). Its
        ``constraint`` is compiled here, so a schema the grammar engine cannot honour is
        refused (``UnsupportedSchemaError``) before any work."""
        if request.cached is not None:
            request.cached.blocks.validate(self._spec)
        grammar = self.grammar_for(request.constraint)
        request_id = f"req-{next(self._ids)}"
        criteria = request.criteria
        active = ActiveRequest(
            request_id,
            request,
            CompletionDetector(self._tokenizer, criteria, self._tokenizer.eos_token_ids),
            self._books.ledger(request_id),
            submitted_at=self._clock(),
            grammar=grammar,
            opening=self._opening(grammar, request),
        )
        if request.cached is not None:  # pin: hot blocks stay put until admission copies them
            self._books.pin(active, request.cached)
        try:
            self._queue.put(request_id, active, request.priority)
        except Exception:
            self._books.release_pin(active)
            raise
        return request_id

    def _opening(self, grammar: Grammar | None, request: GenerationRequest) -> tuple[int, ...]:
        """The reply's forced opening, computed with the prompt; none where the reply may
        not outgrow it (its first sampled token must still fit), nor where the pool holds
        the prompt only without it (admission would wait for room that never comes)."""
        draws_all = request.logprobs is not None or request.sampling.penalized
        if grammar is None or not self._forced_opening or draws_all:
            return ()
        opening = grammar.opening
        if len(opening) >= request.criteria.max_tokens:
            return ()
        needed = self._spec.blocks_for_tokens(len(request.prompt) + len(opening) + 1)
        return opening if needed <= self._books.capacity else ()

    def grammar_for(self, constraint: OutputConstraint | None) -> Grammar | None:
        """The constraint compiled (None for none); any thread. Compiled grammars are
        cached, so a caller that compiles first, off the event loop and outside the engine
        loop's lock, makes ``enqueue``'s own compile a cache hit."""
        if constraint is None:
            return None
        if self._grammars is None:
            raise InvalidRequestError("this server was started without constrained decoding")
        return self._grammars.compile(constraint)

    def cancel(self, request_id: str, failure: str | None = None) -> None:
        """Ask for a request to end at the next round; unknown ids are ignored. With a
        ``failure`` it ends as failed, with that reason (its caller still reads a reply:
        a stream then ends with an error, not as if the reply were whole)."""
        with self._cancel_lock:
            self._cancels[request_id] = failure

    def cancels_pending(self) -> bool:
        with self._cancel_lock:
            return bool(self._cancels)

    def apply_cancellations(self, events: Events) -> None:
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
                self._lifecycle.complete(active, events, keep_kv=keep, error=failure)
