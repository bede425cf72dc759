"""Admission: a queued request's memory reserved and its sequence opened, or why not.

The prefix a request restores was found as it arrived (``HeldPrefix``); admission pins it
again if it was let go, reserves the prompt's blocks (making room when nothing running
will free any), and opens the sequence on the longest part of it the blocks can restore.
A request that cannot be admitted stays queued; one that never can (its restore failed,
no memory came within ``NO_ROOM_PATIENCE_S``) is failed at the end of the round.
"""

from __future__ import annotations

import logging

from semantic.application.books.kv_books import KVBooks
from semantic.application.engine.active_request import ActiveRequest, Phase
from semantic.application.engine.lifecycle import Events, Lifecycle
from semantic.application.engine.prefix_sharing import PrefixSharing
from semantic.application.engine.state import EngineState
from semantic.domain.blocks import AgentBlocks, restorable_prefix
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.errors import NoRoomCameError
from semantic.domain.tokens import reusable_prefix
from semantic.ports.grammar import GrammarMatcher
from semantic.ports.model_backend import ModelBackend

log = logging.getLogger(__name__)

NO_ROOM_PATIENCE_S = 30.0
"""How long the head of the queue waits, with nothing running, for memory held elsewhere
(finished requests' KV on its way to disk) before it is refused, so that a hold that never
ends (a save hung on a dead disk) leaves a 429 to retry, not a request that never answers."""
NO_ROOM_FAILURE = f"no KV memory came free within {NO_ROOM_PATIENCE_S:.0f} s with nothing running"


class Admission:
    def __init__(
        self,
        backend: ModelBackend,
        spec: ModelCacheSpec,
        books: KVBooks,
        sharing: PrefixSharing,
        lifecycle: Lifecycle,
        *,
        state: EngineState,
    ) -> None:
        self._backend = backend
        self._spec = spec
        self._books = books
        self._sharing = sharing
        self._lifecycle = lifecycle
        self._queue = state.queue
        self._running = state.running
        self._clock = state.clock
        self._refused: list[tuple[ActiveRequest, Exception]] = []
        self._reading: set[str] = set()
        """Requests whose sequence reads its restored blocks where they lie."""

    def admit(self, active: ActiveRequest) -> bool:
        """Reserve blocks and build the cache for a queued request; False if it must wait."""
        prompt = active.prompt
        self._books.pin_again(active)
        if not self._books.grow(active.reservation, len(prompt)) and not self._make_room(active):
            return False
        cached = active.request.cached
        n_cached = reusable_prefix(cached.matched if cached is not None else 0, len(prompt))
        try:
            n_cached = self._open(active, cached.blocks if cached else None, n_cached)
        except Exception as error:  # noqa: BLE001 - this request fails; the queue moves on
            self._refuse(active, error)
            return False
        active.phase = Phase.PREFILLING
        active.n_cached = active.prefilled = n_cached
        active.admitted_at = self._clock()
        self._running[active.id] = active
        leader = self._sharing.follow(active, self._running.values())
        if leader is not None:
            self._lifecycle.copy_to_followers(self._running[leader])
        return True

    def undo(self, active: ActiveRequest) -> None:
        """Give back what ``admit`` took; the request stays queued."""
        self._sharing.end(active)
        self._backend.close_sequence(active.id, 0)
        self._books.release(active.reservation)
        active.phase = Phase.WAITING
        active.admitted_at = None
        del self._running[active.id]

    def release_copied(self, copied: frozenset[str] = frozenset()) -> None:
        """Let go of the pinned prefixes the running requests' caches have copied
        (``copied``: those a round reports copied since it opened them in place)."""
        self._reading = (self._reading - copied) & self._running.keys()
        for active in self._running.values():
            if active.request.cached is not None and active.id not in self._reading:
                self._books.copied(active)

    def fail_refused(self, events: Events) -> None:
        """Fail the requests this round refused for good."""
        for active, error in self._refused:
            self._lifecycle.fail(active, error, events)
        self._refused.clear()

    def _refuse(self, active: ActiveRequest, error: Exception) -> None:
        self._books.release(active.reservation)
        self._queue.cancel(active.id)
        self._refused.append((active, error))

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
        in_place = self._backend.open_sequence(
            active.id,
            restored=cached,
            n_restored=n,
            n_new=len(active.prompt) - n,
            sampling=active.request.sampling,
            track_top_prob=active.request.criteria.min_top_prob is not None,
            matcher=_past(grammar.matcher(), active.opening) if grammar else None,
            logprobs=active.request.logprobs,
        )
        if in_place:  # its blocks stay pinned until a round reports them copied
            self._reading.add(active.id)

    def _make_room(self, active: ActiveRequest) -> bool:
        if self._running:  # a request that ends will free memory: wait for it
            active.short_of_room_since = None
            return False
        if self._books.make_room(active, self._queue.items()):
            return True
        self._refuse_if_no_room_comes(active)
        return False

    def _refuse_if_no_room_comes(self, active: ActiveRequest) -> None:
        since = active.short_of_room_since
        if since is None:
            active.short_of_room_since = self._clock()
        elif self._clock() - since >= NO_ROOM_PATIENCE_S:
            self._refuse(active, NoRoomCameError(NO_ROOM_FAILURE))


def _past(matcher: GrammarMatcher, opening: tuple[int, ...]) -> GrammarMatcher:
    """``matcher`` told the reply's forced opening: the prefill computes it with the prompt,
    so the first token sampled is the one after it."""
    for token in opening:
        matcher.accept(token)
    return matcher
