"""A running request's life after admission: its tokens, its end, and the KV it leaves.

Tokens are taken in (the pool grows a block as a request's cache needs one), a prompt's
first token moves it to decoding, a finish or a failure closes its sequence and binds the
KV it exports to the blocks it reserved, and queued requests that share that prefix pin it
(``PrefixSharing.heirs``). Followers waiting for a leader's prefill copy it as soon as the
leader holds the part they share.
"""

from __future__ import annotations

import logging

from semantic.application.books.kv_books import KVBooks
from semantic.application.engine.active_request import ActiveRequest, Phase
from semantic.application.engine.events import CompletionEvent, EngineEvent, TokenEvent
from semantic.application.engine.prefix_sharing import PrefixSharing
from semantic.application.engine.state import EngineState
from semantic.domain.blocks import AgentBlocks
from semantic.domain.errors import NoRoomCameError
from semantic.domain.generation import FinishReason, TokenLogprob
from semantic.ports.model_backend import Join, ModelBackend, SampledToken, StepOutput

log = logging.getLogger(__name__)

Events = list[EngineEvent]


class Lifecycle:
    def __init__(
        self,
        backend: ModelBackend,
        books: KVBooks,
        sharing: PrefixSharing,
        state: EngineState,
    ) -> None:
        self._backend = backend
        self._books = books
        self._sharing = sharing
        self._queue = state.queue
        self._running = state.running
        self._clock = state.clock
        self._joins: list[Join] = []
        """Requests that got their first token, to join the decoder in the next round."""

    def take_joins(self) -> tuple[Join, ...]:
        """The joins for this round, of requests still running."""
        joins = tuple(j for j in self._joins if j.seq_id in self._running)
        self._joins.clear()
        return joins

    def decoding_count(self) -> int:
        return sum(1 for r in self._running.values() if r.phase is Phase.DECODING)

    def decoding(self) -> list[ActiveRequest]:
        return [r for r in self._running.values() if r.phase is Phase.DECODING]

    def fail_decoding(
        self, error: Exception, events: Events, stepping: list[ActiveRequest] | None = None
    ) -> None:
        for active in self.decoding() if stepping is None else stepping:
            if active.id in self._running:
                self.fail(active, error, events)

    def take_output(self, output: StepOutput, events: Events) -> None:
        for seq_id, join_error in output.failed.items():
            joining = self._running.get(seq_id)
            if joining is not None:
                self.fail(joining, join_error, events)
        for token in output.tokens:
            owner = self._running.get(token.seq_id)
            if owner is not None:
                self.accept_token(
                    owner,
                    token.token,
                    token.top_prob,
                    events,
                    together=token.together,
                    logprob=token.logprob,
                )

    def chunk_done(
        self, active: ActiveRequest, n: int, first: SampledToken | None, events: Events
    ) -> None:
        active.prefilled += n
        self.copy_to_followers(active)
        if active.prefilled == len(active.prompt) and first is not None:
            self.first_token(active, first, events)

    def copy_to_followers(self, leader: ActiveRequest) -> None:
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

    def first_token(self, active: ActiveRequest, first: SampledToken, events: Events) -> None:
        """The reply's forced opening (prefilled with the prompt) is its output first."""
        active.first_token_at = self._clock()
        active.phase = Phase.DECODING
        for index, token in enumerate(active.opening):
            self.accept_token(active, token, None, events, together=index > 0)
            if active.id not in self._running:  # ended inside it (a stop string)
                return
        opened = bool(active.opening)
        self.accept_token(
            active, first.token, first.top_prob, events, together=opened, logprob=first.logprob
        )
        if active.id in self._running:
            remaining = active.request.criteria.max_tokens - 1 - len(active.opening)
            self._joins.append(Join(active.id, first.token, remaining))

    def accept_token(
        self,
        active: ActiveRequest,
        token: int,
        top_prob: float | None,
        events: Events,
        *,
        together: bool = False,
        logprob: TokenLogprob | None = None,
    ) -> None:
        """``together``: the token came in the step of the one before it (a forced run);
        ``logprob``: where the request asked for log-probabilities (none for the end of the
        turn: it is no part of the reply)."""
        generated = active.detector.generated_count + 1
        if not self._books.grow(active.reservation, active.positions_after(generated)):
            active.detector.end(FinishReason.POOL_EXHAUSTED)
            self.complete(active, events, keep_kv=True)
            return
        progress = active.detector.add(token, top_prob)
        if progress.finish is FinishReason.END_OF_TURN:
            logprob = None
        events.append(TokenEvent(active.id, token, progress.text, together, logprob))
        if progress.finish is not None:
            self.complete(active, events, keep_kv=True)

    def fail(self, active: ActiveRequest, error: Exception, events: Events) -> None:
        """The request ends as failed; an error from inside the engine (not a refusal for
        want of memory) is logged with its traceback, under the request's id."""
        active.detector.end(FinishReason.ERROR)
        reason = str(error) if isinstance(error, NoRoomCameError) else None
        if reason is None:
            log.error("%s failed: %s", active.id, error, exc_info=error)
        reason = reason or f"{type(error).__name__}: {error}"
        self.complete(active, events, keep_kv=False, error=reason)

    def complete(
        self, active: ActiveRequest, events: Events, *, keep_kv: bool, error: str | None = None
    ) -> None:
        self._running.pop(active.id, None)
        self._sharing.end(active)
        kept = active.detector.kept_tokens
        blocks = None
        if active.pinned:
            self._books.release_pin(active)
        if active.phase is not Phase.WAITING:
            blocks, error = self._close(active, kept, keep_kv, error)
        events.append(self._completion(active, kept, blocks, error))

    def _close(
        self, active: ActiveRequest, kept: list[int], keep_kv: bool, error: str | None
    ) -> tuple[AgentBlocks | None, str | None]:
        """Close the sequence; its exported KV bound to its blocks (None if it kept none),
        and the request's error (a failed close is one)."""
        keep = active.positions_after(len(kept)) if keep_kv else 0
        try:
            exported = self._backend.close_sequence(active.id, keep)
        except Exception as close_error:  # the request is over either way
            log.error("%s: its cache could not be kept", active.id, exc_info=close_error)
            error = error or f"{type(close_error).__name__}: {close_error}"
            exported = None
        if exported is None or exported.n_tokens <= 0:
            self._books.release(active.reservation)
            return None, error
        token_ids = (active.request.prompt + tuple(kept))[: exported.n_tokens]
        layers = self._books.bind(active.reservation, exported)
        blocks = AgentBlocks(active.request.agent_id, token_ids, layers)
        self._hand_on(active, blocks)
        return blocks, error

    def _hand_on(self, active: ActiveRequest, blocks: AgentBlocks) -> None:
        """Queued requests that share a prefix with ``active`` pin the KV it leaves
        (``PrefixSharing.heirs``), unless it ended cancelled or failed (the cache keeps no
        trace of those either)."""
        if active.detector.reason in (FinishReason.CANCELLED, FinishReason.ERROR):
            return
        for heir, shared in self._sharing.heirs(active, blocks, self._queue.items()):
            self._books.pin_instead(heir, shared)

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
            prompt_tokens=len(active.request.prompt),
            blocks=blocks,
            stats=active.stats(self._clock()),
            error=error,
            stop_string=active.detector.stop_string,
        )
