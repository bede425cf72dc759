"""Restored prefixes held for waiting requests: pinned from arrival until admission copies
them, let go when the pool is short, and pinned again at the request's own turn.

A prefix and its copy need twice its blocks, so pins of requests that wait can keep the
head of the queue from fitting. Pins let go cost a read later (``StoredPrefix``), not a
prefill: the docstrings below say who gives way, and when. ADR 0007 has the measurements.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

from semantic.application.active_request import ActiveRequest
from semantic.domain.block_pool import BlockPool
from semantic.domain.blocks import AgentBlocks
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.tokens import common_prefix

log = logging.getLogger(__name__)

HEAD_PIN_PATIENCE_S = 1.0
"""How long a head that fits beside its restored prefix waits, with nothing running, for
blocks held elsewhere (finished requests' KV still being saved, a restore in progress) to
be let go before it drops its pin (keeping the prefix itself until copied: ``make_room``)."""


class PrefixPins:
    def __init__(
        self,
        pool: BlockPool,
        spec: ModelCacheSpec,
        reclaim: Callable[[int], int] | None,
        clock: Callable[[], float],
    ) -> None:
        self._pool = pool
        self._spec = spec
        self._reclaim = reclaim
        self._clock = clock

    def pin(self, active: ActiveRequest, blocks: AgentBlocks) -> None:
        """Hold ``blocks`` for ``active`` until its cache has copied them."""
        self._pool.share(active.pin_owner, blocks.pool_ids())
        active.pinned = True

    def pin_instead(self, active: ActiveRequest, blocks: AgentBlocks) -> None:
        """Hold ``blocks`` (a longer prefix: the KV a finished request left) for ``active``
        in place of what it holds, as if its lookup at arrival had found them."""
        if active.pinned:
            self.release(active)
        self.pin(active, blocks)
        active.request = replace(active.request, cached=blocks)

    def release(self, active: ActiveRequest) -> None:
        self._pool.release_owner(active.pin_owner)
        active.pinned = False

    def copied(self, active: ActiveRequest) -> None:
        """``active``'s cache holds its prefix now: the blocks and their memory can go."""
        if active.pinned:
            self.release(active)
        active.request = replace(active.request, cached=None)

    def pin_again(self, active: ActiveRequest) -> None:
        """Pin the stored prefix again if the one pinned at arrival was let go to make room
        or fell short of it (the pool was full then), once the pool can hold all of it:
        pinned before the request's own blocks are claimed, as at arrival, so a request
        that then waits holds its prefix. Tried once; what was pinned stays pinned until
        something longer is, so a read that fails costs nothing held."""
        stored, cached = active.request.stored, active.request.cached
        held = common_prefix(cached.token_ids, active.prompt) if cached is not None else 0
        if stored is None or held >= stored.tokens:
            return
        if not self._room_for(stored.blocks_to_read()):
            return
        trial = f"{active.pin_owner}/again"
        try:
            again = stored.pin(trial)
        except Exception:  # the request goes on with what it holds, logged
            log.warning("pinning %s's stored prefix again failed", active.id, exc_info=True)
            again = None
        if again is None or common_prefix(again.token_ids, active.prompt) <= held:
            self._pool.release_owner(trial)
            active.request = replace(active.request, stored=None)  # tried once
            return
        self._pool.release_owner(active.pin_owner)
        self._pool.transfer(trial, active.pin_owner, again.pool_ids())
        self._pool.release_owner(trial)
        active.pinned = True
        active.request = replace(active.request, cached=again)

    def make_room(
        self, head: ActiveRequest, waiting: Sequence[ActiveRequest], fits: Callable[[], bool]
    ) -> bool:
        """With nothing running, no request's end will free memory, and pins could keep the
        head waiting forever, and everyone behind it. The pins of requests behind it are let
        go, the last in line's first, until the head ``fits``: each pins its prefix again at
        its own admission. What else holds blocks (finished requests' KV on its way to
        disk, a restore in progress) lets go by itself, so the head then waits for it,
        keeping its own pin, unless its prefix and prompt could never fit together or it
        has waited ``HEAD_PIN_PATIENCE_S``. Then its pin goes too, but not its prefix: the
        blocks' memory stays with the request until its cache has copied them, beyond the
        budget by that much for a while, instead of the prompt being computed again (an
        agent past ~40% of the pool would otherwise compute its whole history every turn)."""
        for behind in reversed([w for w in waiting if w is not head]):
            if behind.pinned:
                self.release(behind)
                behind.request = replace(behind.request, cached=None)
                self.pin_again(head)  # its own prefix first, if that now has room
                if fits():
                    return True
        if not head.pinned or not self._head_gives_up(head):
            return False
        self.release(head)
        head.request = replace(head.request, stored=None)
        return fits()

    def _head_gives_up(self, head: ActiveRequest) -> bool:
        pinned = len(self._pool.held_by(head.pin_owner))
        if pinned + head.reservation.shortfall(len(head.prompt)) > self._pool.capacity:
            return True
        now = self._clock()
        if head.short_of_room_since is None:
            head.short_of_room_since = now
        return now - head.short_of_room_since >= HEAD_PIN_PATIENCE_S

    def _room_for(self, blocks: int) -> bool:
        if not self._pool.can_allocate(blocks) and self._reclaim is not None:
            self._reclaim(blocks - self._pool.free_count)
        return self._pool.can_allocate(blocks)
