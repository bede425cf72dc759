"""KVBooks: the one owner of the engine's block books.

Every hold the engine takes on the block pool goes through here: a request's reservation,
grown as its cache grows and bound to its exported KV at the end (``BlockLedger``); the
restored prefix a waiting request pins from arrival until admission copies it, lets go
when the pool is short and pins again at its own turn; the admission check of what the
pool can still hand out; and the hold a completion keeps until the cache adopts it.
Where the pool is short, ``reclaim(n)`` (the cache evicting idle KV) is asked first.

Invariants (checked by ``tests/unit/test_kv_books.py`` over random operation sequences):
a ledger's ids are exactly what the pool holds under its owner; a pin is held under the
request's ``pin_owner`` exactly while ``active.pinned``; nothing is freed twice, nothing
leaks, and free + held == capacity after every operation.

A prefix and its copy need twice its blocks, so pins of requests that wait can keep the
head of the queue from fitting. Pins let go cost a read later (``StoredPrefix``), not a
prefill: the docstrings below say who gives way, and when. ADR 0007 has the measurements.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from semantic.application.books.ledger import BlockLedger
from semantic.application.engine.active_request import ActiveRequest, HeldPrefix
from semantic.domain.block_pool import BlockPool
from semantic.domain.blocks import AgentBlocks, KVBlock
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.errors import PoolExhaustedError
from semantic.ports.model_backend import ExportedKV

log = logging.getLogger(__name__)

HEAD_PIN_PATIENCE_S = 1.0
"""How long a head that fits beside its restored prefix waits, with nothing running, for
blocks held elsewhere (finished requests' KV still being saved, a restore in progress) to
be let go before it drops its pin (keeping the prefix itself until copied: ``make_room``)."""

Reclaim = Callable[[int], int]
"""Asked to free ``n`` pool blocks (by evicting idle cached KV); returns how many it freed."""


class KVBooks:
    def __init__(
        self,
        pool: BlockPool,
        spec: ModelCacheSpec,
        *,
        reclaim: Reclaim | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pool = pool
        self._spec = spec
        self._reclaim = reclaim
        self._clock = clock

    @property
    def pool(self) -> BlockPool:
        return self._pool

    # -- reservations: a request's own blocks ------------------------------------------

    def ledger(self, owner: str) -> BlockLedger:
        """An empty reservation for ``owner``."""
        return BlockLedger(owner, self._spec.n_layers)

    def shortfall(self, ledger: BlockLedger, n_positions: int) -> int:
        """Blocks still to claim for ``n_positions`` (0 if already covered)."""
        return sum(
            max(0, self._spec.blocks_for_layer(layer, n_positions) - len(ids))
            for layer, ids in enumerate(ledger.ids)
        )

    def grow(self, ledger: BlockLedger, n_positions: int) -> bool:
        """Claim what ``n_positions`` need, all at once or not at all (a sliding layer
        never more than its window reaches), asking ``reclaim`` for the shortfall first
        if the pool is short; False (nothing claimed) if it stays short."""
        if self._grow_to(ledger, n_positions):
            return True
        if self._reclaim is None:
            return False
        self._reclaim(self.shortfall(ledger, n_positions))
        return self._grow_to(ledger, n_positions)

    def _grow_to(self, ledger: BlockLedger, n_positions: int) -> bool:
        if n_positions <= ledger.positions:
            return True
        if self._holds_exactly(ledger, n_positions):
            ledger.positions = n_positions
            return True
        if not self._pool.can_allocate(self.shortfall(ledger, n_positions)):
            return False
        try:
            for layer, ids in enumerate(ledger.ids):
                target = self._spec.blocks_for_layer(layer, n_positions)
                if target > len(ids):
                    ids.extend(self._pool.allocate(ledger.owner, layer, target - len(ids)))
                elif target < len(ids):  # a sliding window moved past its oldest block
                    surplus = len(ids) - target
                    self._pool.release(ledger.owner, ids[:surplus])
                    del ids[:surplus]
        except PoolExhaustedError:  # another thread took blocks between check and claim
            return False
        ledger.positions = n_positions
        return True

    def _holds_exactly(self, ledger: BlockLedger, n_positions: int) -> bool:
        """Every layer holds the blocks ``n_positions`` need, no more: a decode step within
        a block, the usual case. Global layers only (where every layer needs the same count);
        the full walk over SmolLM2's 30 layers cost 3.9 ms of a 16-sequence step (cProfile,
        the 2-core Zen 3 VM of ADR 0010's last amendment)."""
        if self._spec.has_sliding_layers:
            return False
        need = self._spec.blocks_for_layer(0, n_positions)
        return all(len(ids) == need for ids in ledger.ids)

    def bind(self, ledger: BlockLedger, exported: ExportedKV) -> tuple[tuple[KVBlock, ...], ...]:
        """Wrap exported payloads as blocks on the claimed ids (extraction allocates
        nothing new); give back the ids left over. The blocks stay held under the
        ledger's owner until the cache adopts them (``release_completion``)."""
        layers: list[tuple[KVBlock, ...]] = []
        for layer, exported_payloads in enumerate(exported.layers):
            ids = ledger.ids[layer]
            payloads = exported_payloads
            if len(payloads) > len(ids):  # a sliding layer's history: kept if there is room
                ids.extend(self._claim(ledger.owner, layer, len(payloads) - len(ids)))
                payloads = payloads[len(payloads) - len(ids) :]  # else its oldest blocks go
            layers.append(
                tuple(
                    KVBlock(pool_id, layer, p.index, p.n_tokens, p.data, p.start)
                    for pool_id, p in zip(ids, payloads, strict=False)
                )
            )
            surplus = ids[len(payloads) :]
            if surplus:
                self._pool.release(ledger.owner, surplus)
            del ids[len(payloads) :]
        ledger.positions = exported.n_tokens
        return tuple(layers)

    def _claim(self, owner: str, layer: int, n: int) -> list[int]:
        """``n`` more blocks of ``layer``, or none if the pool is short of them."""
        try:
            return self._pool.allocate(owner, layer, n)
        except PoolExhaustedError:
            return []

    def release(self, ledger: BlockLedger) -> None:
        """Give back every block the ledger holds."""
        self._pool.release(ledger.owner, ledger.clear())

    def release_completion(self, request_id: str) -> None:
        """Drop the hold a completion's blocks still have under ``request_id`` (once the
        cache has adopted them under its own owner, or nobody will)."""
        self._pool.release_owner(request_id)

    @property
    def capacity(self) -> int:
        """Blocks the pool holds in all, free or not."""
        return self._pool.capacity

    def fits(self, blocks: int) -> bool:
        """Whether the pool can hand out ``blocks`` now, after asking ``reclaim`` for
        what it is short of."""
        shortfall = blocks - self._pool.free_count
        if shortfall > 0 and self._reclaim is not None:
            self._reclaim(shortfall)
        return blocks <= self._pool.free_count

    # -- pins: restored prefixes held for waiting requests -----------------------------

    def pin(self, active: ActiveRequest, prefix: HeldPrefix) -> None:
        """Hold ``prefix``'s blocks for ``active`` until its cache has copied them."""
        self._pool.share(active.pin_owner, prefix.blocks.pool_ids())
        active.pinned = True

    def pin_instead(self, active: ActiveRequest, blocks: AgentBlocks) -> None:
        """Hold ``blocks`` (a longer prefix: the KV a finished request left) for ``active``
        in place of what it holds, as if its lookup at arrival had found them."""
        if active.pinned:
            self.release_pin(active)
        prefix = HeldPrefix.of(blocks, active.prompt)
        self.pin(active, prefix)
        active.request = replace(active.request, cached=prefix)

    def release_pin(self, active: ActiveRequest) -> None:
        self._pool.release_owner(active.pin_owner)
        active.pinned = False

    def copied(self, active: ActiveRequest) -> None:
        """``active``'s cache holds its prefix now: the blocks and their memory can go."""
        if active.pinned:
            self.release_pin(active)
        active.request = replace(active.request, cached=None)

    def pin_again(self, active: ActiveRequest) -> None:
        """Pin the stored prefix again if the one pinned at arrival was let go to make room
        or fell short of it (the pool was full then), once the pool can hold all of it:
        pinned before the request's own blocks are claimed, as at arrival, so a request
        that then waits holds its prefix. Tried once; what was pinned stays pinned until
        something longer is, so a read that fails costs nothing held."""
        stored, cached = active.request.stored, active.request.cached
        held = cached.matched if cached is not None else 0
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
        prefix = HeldPrefix.of(again, active.prompt) if again is not None else None
        if prefix is None or prefix.matched <= held:
            self._pool.release_owner(trial)
            active.request = replace(active.request, stored=None)  # tried once
            return
        self._pool.release_owner(active.pin_owner)
        self._pool.transfer(trial, active.pin_owner, prefix.blocks.pool_ids())
        self._pool.release_owner(trial)
        active.pinned = True
        active.request = replace(active.request, cached=prefix)

    def make_room(self, head: ActiveRequest, waiting: Sequence[ActiveRequest]) -> bool:
        """With nothing running, no request's end will free memory, and pins could keep the
        head waiting forever, and everyone behind it. The pins of requests behind it are let
        go, the last in line's first, until the head's prompt fits: each pins its prefix
        again at its own admission. What else holds blocks (finished requests' KV on its
        way to disk, a restore in progress) lets go by itself, so the head then waits for
        it, keeping its own pin, unless its prefix and prompt could never fit together or
        it has waited ``HEAD_PIN_PATIENCE_S``. Then its pin goes too, but not its prefix:
        the blocks' memory stays with the request until its cache has copied them, beyond
        the budget by that much for a while, instead of the prompt being computed again
        (an agent past ~40% of the pool would otherwise compute its whole history every
        turn)."""
        for behind in reversed([w for w in waiting if w is not head]):
            if behind.pinned:
                self.release_pin(behind)
                behind.request = replace(behind.request, cached=None)
                self.pin_again(head)  # its own prefix first, if that now has room
                if self.grow(head.reservation, len(head.prompt)):
                    return True
        if not head.pinned or not self._head_gives_up(head):
            return False
        self.release_pin(head)
        head.request = replace(head.request, stored=None)
        return self.grow(head.reservation, len(head.prompt))

    def _head_gives_up(self, head: ActiveRequest) -> bool:
        pinned = len(self._pool.held_by(head.pin_owner))
        if pinned + self.shortfall(head.reservation, len(head.prompt)) > self._pool.capacity:
            return True
        now = self._clock()
        if head.short_of_room_since is None:
            head.short_of_room_since = now
        return now - head.short_of_room_since >= HEAD_PIN_PATIENCE_S

    def _room_for(self, blocks: int) -> bool:
        if not self._pool.can_allocate(blocks) and self._reclaim is not None:
            self._reclaim(blocks - self._pool.free_count)
        return self._pool.can_allocate(blocks)
