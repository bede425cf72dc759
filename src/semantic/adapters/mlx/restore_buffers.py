"""Memory for block restores that is already touched, so a read need not zero it first.

MLX has no uninitialised allocation (``mx.empty`` is ``mx.zeros`` here), so a fresh buffer
for a block file costs a full write pass before the read fills it: 23 of ~90 ms of thread
time for a 4,096-token restore. A restore's buffer is therefore kept, once nothing can reach
the KV inside it, for the next restore of a block of the same size; a reserve made at start
means the first restores after a restart skip the zeroing too, the way GPU servers carve
their KV pool out up front.

Safety rests on Python's reference counts: every tensor viewing a buffer is held by an
``MlxKV`` that also holds the buffer's ``Lease``, and the lease gives the buffer back only
when the last of them is gone. Nothing outside ``kv_blocks`` derives arrays from a block's
views, and that module evaluates what it derives before returning, so no lazy graph keeps a
view alive behind the lease's back.
"""

from __future__ import annotations

import threading
from collections import defaultdict

import mlx.core as mx


class Lease:
    """Holds a buffer for the tensors viewing it; returns it to its pool when collected."""

    __slots__ = ("_buffer", "_pool")

    def __init__(self, buffer: mx.array, pool: RestoreBuffers) -> None:
        self._buffer = buffer
        self._pool = pool

    def __del__(self) -> None:
        self._pool.give_back(self._buffer)


class RestoreBuffers:
    """Free uint8 MLX buffers by size, at most ``max_bytes`` of them kept."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._kept_bytes = 0
        self._free: defaultdict[int, list[mx.array]] = defaultdict(list)
        self._lock = threading.Lock()

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    @property
    def kept_bytes(self) -> int:
        return self._kept_bytes

    def take(self, n_bytes: int) -> mx.array:
        """A buffer of ``n_bytes`` whose contents are undefined: the caller overwrites it."""
        with self._lock:
            free = self._free.get(n_bytes)
            if free:
                self._kept_bytes -= n_bytes
                return free.pop()
        buffer = mx.zeros((n_bytes,), dtype=mx.uint8)
        mx.eval(buffer)
        return buffer

    def lease(self, buffer: mx.array) -> Lease:
        return Lease(buffer, self)

    def give_back(self, buffer: mx.array) -> None:
        """Keep ``buffer`` for reuse; the caller must hold no view of it any more."""
        n_bytes = int(buffer.nbytes)
        with self._lock:
            if self._kept_bytes + n_bytes <= self._max_bytes:
                self._free[n_bytes].append(buffer)
                self._kept_bytes += n_bytes

    def reserve(self, n_bytes: int, count: int) -> int:
        """Touch ``count`` buffers of ``n_bytes`` now (within the cap); returns how many."""
        made = 0
        for _ in range(count):
            if self._kept_bytes + n_bytes > self._max_bytes:
                break
            buffer = mx.zeros((n_bytes,), dtype=mx.uint8)
            mx.eval(buffer)
            self.give_back(buffer)
            made += 1
        return made
