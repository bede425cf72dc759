"""Hot blocks: KV kept in memory under the pool's budget, found by key or by parent.

Every hot block is held in the pool by the owner ``CACHE_OWNER``; a request that restores
from it adds its own hold until it has copied the data. Eviction takes blocks that are safe
on disk, or that could not be saved, and that nobody else holds, in the eviction order:
by their agents' retention hints, then least recently used (ADR 0028; ``lru_order`` for
``--eviction lru``).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from semantic.application.cache.eviction_policy import agent_order
from semantic.application.cache.retention_book import BlockHint
from semantic.domain.block_pool import BlockPool
from semantic.domain.blocks import KVBlock
from semantic.domain.retention import DEFAULT_PRIORITY

CACHE_OWNER = "cache"


@dataclass(slots=True)
class HotBlock:
    """One token block of one namespace's chain, with the KV of every layer that holds it."""

    key: str
    parent: str
    index: int
    tokens: tuple[int, ...]
    layers: tuple[KVBlock | None, ...]
    persisted: bool = False
    save_failed: bool = False
    """Its save failed (a full disk, say): nothing will make it safe on disk, so it may be
    dropped like a persisted block, or memory it holds would never come back."""
    last_used: float = field(default=0.0)
    priority: int = DEFAULT_PRIORITY
    expires_at: float | None = None
    """Monotonic time its users' TTLs keep it in memory until (``inf``: a user keeps it
    without one; None: no user has said yet, as for a block loaded ahead of its turn)."""
    pinned: bool = False
    held_until: float = 0.0
    """Monotonic time a tool wait keeps it before others (its agent's next turn is due)."""
    namespace: str = ""
    """Whose chain it is in: what its namespace's memory quota counts."""

    @property
    def present(self) -> list[KVBlock]:
        return [block for block in self.layers if block is not None]

    def pool_ids(self) -> list[int]:
        return [block.pool_id for block in self.present]


class HotIndex:
    def __init__(
        self,
        pool: BlockPool,
        clock: Callable[[], float] = time.monotonic,
        order: Callable[[Sequence[HotBlock], float], list[HotBlock]] = agent_order,
    ) -> None:
        """``order``: which evictable blocks go first when memory is short."""
        self._pool = pool
        self._clock = clock
        self._order = order
        self._blocks: OrderedDict[str, HotBlock] = OrderedDict()
        self._children: dict[str, set[str]] = {}
        self._lock = threading.RLock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._blocks)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._blocks

    def peek(self, key: str) -> HotBlock | None:
        """The block, its place in the eviction order untouched (a look, not a use)."""
        with self._lock:
            return self._blocks.get(key)

    def get(self, key: str) -> HotBlock | None:
        with self._lock:
            block = self._blocks.get(key)
            if block is not None:
                self._touch(block)
            return block

    def children(self, parent: str) -> list[HotBlock]:
        with self._lock:
            return [self._blocks[k] for k in self._children.get(parent, ()) if k in self._blocks]

    def add(self, block: HotBlock, pin: str | None = None) -> HotBlock:
        """Index a block whose pool ids ``CACHE_OWNER`` already holds, and pin it for ``pin``.

        Returns the block now indexed under its key: ``block``, or the one that was already
        hot (the caller then gives ``block``'s ids back).
        """
        with self._lock:
            kept = self._blocks.get(block.key)
            if kept is None:
                kept = block
                self._blocks[block.key] = block
                self._children.setdefault(block.parent, set()).add(block.key)
            self._touch(kept)
            if pin is not None:
                self._pool.share(pin, kept.pool_ids())
            return kept

    def take(self, key: str, pin: str) -> HotBlock | None:
        """The hot block under ``key``, pinned for ``pin`` so eviction cannot drop it."""
        with self._lock:
            block = self._blocks.get(key)
            if block is None:
                return None
            self._pool.share(pin, block.pool_ids())
            self._touch(block)
            return block

    def mark_persisted(self, keys: Iterable[str]) -> None:
        with self._lock:
            for key in keys:
                if key in self._blocks:
                    self._blocks[key].persisted = True

    def mark_save_failed(self, keys: Iterable[str]) -> None:
        with self._lock:
            for key in keys:
                if key in self._blocks and not self._blocks[key].persisted:
                    self._blocks[key].save_failed = True

    def evict(self, n_pool_blocks: int) -> int:
        """Drop evictable blocks in the eviction order (past their TTL, unpinned, low
        priority, least recently used first) until ``n_pool_blocks`` pool blocks are free
        again (or nothing more can go); returns how many pool blocks were freed."""
        freed = 0
        with self._lock:
            for block in self._order(list(self._blocks.values()), self._clock()):
                if freed >= n_pool_blocks:
                    break
                evictable = block.persisted or block.save_failed
                if evictable and self._only_cache_holds(block):
                    freed += len(self._drop(block))
        return freed

    def retain(self, blocks: Iterable[HotBlock], hint: BlockHint) -> None:
        """A use of ``blocks`` by an agent with these hints: the highest priority of their
        users, a pin if any, the latest TTL deadline (``inf`` from a user without one)."""
        with self._lock:
            for block in blocks:
                block.priority = max(block.priority, hint.priority)
                block.pinned = block.pinned or hint.pinned
                ends = block.expires_at
                block.expires_at = hint.expires_at if ends is None else max(ends, hint.expires_at)

    def hold(self, keys: Iterable[str], until: float) -> int:
        """Rank these blocks as kept until ``until`` (an agent waiting on its tools): they
        leave memory after blocks not held, and need not leave when it passes. How many
        are in memory."""
        held = 0
        with self._lock:
            for key in keys:
                block = self._blocks.get(key)
                if block is not None:
                    block.held_until = max(block.held_until, until)
                    held += 1
        return held

    def pool_blocks_by_namespace(self) -> dict[str, int]:
        """Pool blocks each namespace's hot blocks hold (its memory, in the pool's unit)."""
        held: dict[str, int] = {}
        with self._lock:
            for block in self._blocks.values():
                held[block.namespace] = held.get(block.namespace, 0) + len(block.present)
        return held

    def trim(self, namespace: str, max_pool_blocks: int) -> int:
        """Over its memory quota, a namespace gives up its own blocks, least valuable first
        (the eviction order), until it holds ``max_pool_blocks``; how many pool blocks went.
        Blocks not yet saved, or in use, stay until they can go."""
        freed = 0
        with self._lock:
            mine = [b for b in self._blocks.values() if b.namespace == namespace]
            held = sum(len(b.present) for b in mine)
            for block in self._order(mine, self._clock()):
                if held - freed <= max_pool_blocks:
                    break
                if (block.persisted or block.save_failed) and self._only_cache_holds(block):
                    freed += len(self._drop(block))
        return freed

    def expire(self) -> int:
        """Move blocks past their TTL to disk (they are already saved there): their memory
        goes back to the pool; how many went. Blocks not yet saved, or in use, wait."""
        now = self._clock()
        with self._lock:
            due = [
                block
                for block in self._blocks.values()
                if block.expires_at is not None and block.expires_at <= now
            ]
            dropped = [b for b in due if b.persisted and self._only_cache_holds(b)]
            for block in dropped:
                self._drop(block)
        return len(dropped)

    def demote(self, keys: Iterable[str]) -> int:
        """Drop those of ``keys`` that are safe on disk and that nobody else holds (a
        running request's restore, say); how many were dropped."""
        dropped = 0
        with self._lock:
            for key in keys:
                block = self._blocks.get(key)
                if block is not None and block.persisted and self._only_cache_holds(block):
                    self._drop(block)
                    dropped += 1
        return dropped

    def remove(self, keys: Iterable[str]) -> None:
        """Forget blocks (their agent is gone); blocks someone still holds stay."""
        with self._lock:
            for key in keys:
                block = self._blocks.get(key)
                if block is not None and self._only_cache_holds(block):
                    self._drop(block)

    def held_bytes_blocks(self) -> int:
        with self._lock:
            return sum(len(b.present) for b in self._blocks.values())

    def _only_cache_holds(self, block: HotBlock) -> bool:
        return all(self._pool.ref_count(pool_id) == 1 for pool_id in block.pool_ids())

    def _drop(self, block: HotBlock) -> list[int]:
        del self._blocks[block.key]
        siblings = self._children.get(block.parent)
        if siblings is not None:
            siblings.discard(block.key)
            if not siblings:
                del self._children[block.parent]
        return self._pool.release(CACHE_OWNER, block.pool_ids())

    def _touch(self, block: HotBlock) -> None:
        block.last_used = self._clock()
        self._blocks.move_to_end(block.key)
