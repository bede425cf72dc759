"""BlockPool: the byte budget for KV, counted in blocks of one layer.

The pool does not hold tensors. It hands out block ids and keeps, for every id, the set of
owners holding it (a request while it runs, the hot cache while the block is kept). A block
returns to the free list only when its last owner lets go, so one block can serve several
agents that share a prefix. Every operation is O(1) per block and guarded by one lock.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.errors import (
    BlockOwnershipError,
    InvalidRequestError,
    PoolExhaustedError,
    PoolIntegrityError,
)


@dataclass(frozen=True, slots=True)
class PoolUsage:
    capacity: int
    used: int
    peak_used: int

    @property
    def free(self) -> int:
        return self.capacity - self.used


class BlockPool:
    """Allocate, share and free block ids by owner; thread-safe."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise InvalidRequestError(f"pool capacity must be positive, got {capacity}")
        self._capacity = capacity
        self._free: deque[int] = deque(range(capacity))
        self._holders: dict[int, set[str]] = {}
        self._held: dict[str, set[int]] = {}
        self._layer: dict[int, int] = {}
        self._peak = 0
        self._lock = threading.RLock()

    @classmethod
    def from_budget(cls, spec: ModelCacheSpec, budget_bytes: int) -> BlockPool:
        """A pool with as many blocks as ``budget_bytes`` of this model's KV can hold."""
        capacity = budget_bytes // spec.block_bytes
        if capacity <= 0:
            raise InvalidRequestError(
                f"a KV budget of {budget_bytes} bytes holds no block of {spec.block_bytes} bytes"
            )
        return cls(capacity)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def free_count(self) -> int:
        with self._lock:
            return len(self._free)

    @property
    def used_count(self) -> int:
        with self._lock:
            return self._capacity - len(self._free)

    def usage(self) -> PoolUsage:
        with self._lock:
            return PoolUsage(self._capacity, self._capacity - len(self._free), self._peak)

    def reset_peak(self) -> None:
        with self._lock:
            self._peak = self._capacity - len(self._free)

    def can_allocate(self, n: int) -> bool:
        with self._lock:
            return n <= len(self._free)

    def allocate(self, owner: str, layer: int, n: int = 1) -> list[int]:
        """Hand ``n`` fresh blocks of ``layer`` to ``owner``, or none at all.

        Raises ``PoolExhaustedError`` (saying what was asked and what is free) when fewer
        than ``n`` blocks are free; nothing changes in that case.
        """
        if n < 0:
            raise InvalidRequestError(f"cannot allocate a negative number of blocks ({n})")
        return self.allocate_layers(owner, [layer] * n)

    def allocate_layers(self, owner: str, layers: Sequence[int]) -> list[int]:
        """One fresh block for each entry of ``layers`` (a whole block read from disk), under
        one lock; all or none, as ``allocate``."""
        with self._lock:
            if len(layers) > len(self._free):
                raise PoolExhaustedError(
                    requested=len(layers), free=len(self._free), capacity=self._capacity
                )
            ids = [self._free.popleft() for _ in layers]
            mine = self._held.setdefault(owner, set())
            for block_id, layer in zip(ids, layers, strict=True):
                self._holders[block_id] = {owner}
                self._layer[block_id] = layer
            mine.update(ids)
            self._peak = max(self._peak, self._capacity - len(self._free))
            return ids

    def share(self, owner: str, block_ids: Iterable[int]) -> None:
        """Add ``owner`` as a holder of blocks someone already holds."""
        with self._lock:
            ids = list(block_ids)
            for block_id in ids:
                holders = self._holders.get(block_id)
                if not holders:
                    raise BlockOwnershipError(f"block {block_id} is free; it cannot be shared")
                if owner in holders:
                    raise BlockOwnershipError(f"{owner!r} already holds block {block_id}")
            mine = self._held.setdefault(owner, set())
            for block_id in ids:
                self._holders[block_id].add(owner)
                mine.add(block_id)

    def release(self, owner: str, block_ids: Iterable[int]) -> list[int]:
        """Drop ``owner``'s hold on blocks; returns the ids that became free."""
        with self._lock:
            ids = list(block_ids)
            mine = self._held.get(owner, set())
            missing = [b for b in ids if b not in mine]
            if missing:
                raise BlockOwnershipError(f"{owner!r} does not hold blocks {missing[:8]}")
            return self._drop(owner, ids)

    def release_owner(self, owner: str) -> list[int]:
        """Drop every hold ``owner`` has; returns the ids that became free."""
        with self._lock:
            return self._drop(owner, list(self._held.get(owner, ())))

    def transfer(self, src: str, dst: str, block_ids: Iterable[int]) -> None:
        """Move holds from ``src`` to ``dst`` without a moment where the blocks are free."""
        with self._lock:
            ids = list(block_ids)
            self.share(dst, [b for b in ids if dst not in self._holders.get(b, ())])
            self.release(src, ids)

    def held_by(self, owner: str) -> frozenset[int]:
        with self._lock:
            return frozenset(self._held.get(owner, ()))

    def ref_count(self, block_id: int) -> int:
        with self._lock:
            return len(self._holders.get(block_id, ()))

    def layer_of(self, block_id: int) -> int:
        with self._lock:
            if block_id not in self._layer:
                raise BlockOwnershipError(f"block {block_id} is not allocated")
            return self._layer[block_id]

    def owners(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._held)

    def check_integrity(self) -> None:
        """Raise with the real counts if the pool's books do not balance."""
        with self._lock:
            free = set(self._free)
            allocated = set(self._holders)
            problems = []
            if len(free) != len(self._free):
                problems.append(f"free list has {len(self._free) - len(free)} duplicates")
            if free & allocated:
                problems.append(f"{len(free & allocated)} blocks are both free and held")
            if len(free) + len(allocated) != self._capacity:
                problems.append(
                    f"free {len(free)} + held {len(allocated)} != capacity {self._capacity}"
                )
            from_owners = {b for ids in self._held.values() for b in ids}
            if from_owners != allocated:
                problems.append("owner index and holder index disagree")
            for block_id, holders in self._holders.items():
                if any(block_id not in self._held.get(o, ()) for o in holders):
                    problems.append(f"block {block_id} lists a holder that does not list it")
                    break
            if problems:
                raise PoolIntegrityError("; ".join(problems))

    def _drop(self, owner: str, ids: list[int]) -> list[int]:
        mine = self._held.get(owner)
        freed: list[int] = []
        for block_id in ids:
            holders = self._holders[block_id]
            holders.discard(owner)
            if mine is not None:
                mine.discard(block_id)
            if not holders:
                del self._holders[block_id]
                del self._layer[block_id]
                self._free.append(block_id)
                freed.append(block_id)
        if mine is not None and not mine:
            del self._held[owner]
        return freed
