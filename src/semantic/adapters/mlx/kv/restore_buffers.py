"""Memory for block restores that is already touched, so a read need not zero it first.

MLX has no uninitialised allocation (``mx.empty`` is ``mx.zeros`` here), so a fresh buffer
for a block file costs a full write pass before the read fills it: 23 of ~90 ms of thread
time for a 4,096-token restore. A restore's buffer is therefore kept, once nothing can reach
the KV inside it, for the next restore of a block of the same size; a reserve made once
the server answers means the first restores after a restart skip the zeroing too, the way
GPU servers carve their KV pool out up front. Finished sequences are cut into these buffers as well
(``kv_blocks.cut_into_blocks``), so exports and restores share the reserve: an export that
took a reserved buffer leaves a later restore to zero a fresh one, until its block is gone.

Safety rests on Python's reference counts: every block payload over a buffer (a
``StackedKV``, or an ``MlxKV`` of views) holds the buffer's ``Lease``, and the lease gives the
buffer back only when the last of them is gone. Views of a ``StackedKV`` live only inside
one ``kv_blocks.gather_cache`` call, which holds the blocks and copies what it takes (never
hands a block's memory to a cache), in a ``RestoredPrefix``, which holds the payloads
(and so their leases) for as long as the host pass may read its addresses, or in the host
views the writer saves a block from (``MlxHostCodec.to_host``), while the save holds the
block. So no view outlives the lease that covers it. A numpy view does not hold the lease:
a view kept after its blocks are gone would see the buffer reused.
"""

from __future__ import annotations

import queue
import threading
from collections import OrderedDict

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
    """Free uint8 MLX buffers by size, at most ``max_bytes`` of them kept (see
    ``_drop_one`` for which go when over)."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._kept_bytes = 0
        self._free: OrderedDict[int, list[mx.array]] = OrderedDict()
        self._returned: queue.SimpleQueue[mx.array] = queue.SimpleQueue()
        self._lock = threading.Lock()

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    @property
    def kept_bytes(self) -> int:
        with self._lock:
            self._sort_returned()
            return self._kept_bytes

    def take(self, n_bytes: int) -> mx.array:
        """A buffer of ``n_bytes`` whose contents are undefined: the caller overwrites it."""
        with self._lock:
            self._sort_returned()
            free = self._free.get(n_bytes)
            if free:
                self._kept_bytes -= n_bytes
                buffer = free.pop()
                if not free:
                    del self._free[n_bytes]
                return buffer
        buffer = mx.zeros((n_bytes,), dtype=mx.uint8)
        mx.eval(buffer)
        return buffer

    def lease(self, buffer: mx.array) -> Lease:
        return Lease(buffer, self)

    def give_back(self, buffer: mx.array) -> None:
        """Keep ``buffer`` for reuse; the caller must hold no view of it any more. Safe from
        ``__del__`` at any moment (a garbage collection inside ``take`` included): it only
        queues the buffer, which the next ``take`` files."""
        if self._max_bytes > 0:
            self._returned.put(buffer)

    def reserve(self, n_bytes: int, count: int) -> int:
        """Touch up to ``count`` buffers of ``n_bytes`` now, as many as the cap has room
        for beside those kept (restores and exports give theirs back meanwhile); returns
        how many were made."""
        made = 0
        for _ in range(count):
            with self._lock:
                self._sort_returned()
                if self._kept_bytes + n_bytes > self._max_bytes:
                    break
            self.give_back(_touched(n_bytes))  # made outside the lock: restores go on
            made += 1
        return made

    def _sort_returned(self) -> None:
        """With the lock held: file the buffers given back since, within the cap."""
        while True:
            try:
                buffer = self._returned.get_nowait()
            except queue.Empty:
                return
            n_bytes = int(buffer.nbytes)
            if n_bytes > self._max_bytes:
                continue
            self._free.setdefault(n_bytes, []).append(buffer)
            self._free.move_to_end(n_bytes)
            self._kept_bytes += n_bytes
            while self._kept_bytes > self._max_bytes:
                self._drop_one()

    def _drop_one(self) -> None:
        """With the lock held: let go of one buffer. The largest size is a whole block's,
        smaller ones are partial blocks, one per conversation. A whole block goes while the
        partial ones hold at most a quarter of the cap, so the tail a restore just returned
        stays with it (dropping by age alone dropped it, and every restore zeroed a fresh
        one); beyond that the partial size returned longest ago goes, so the tails of many
        conversations never crowd out the whole blocks most restores want."""
        whole = max(self._free)
        partial = self._kept_bytes - whole * len(self._free[whole])
        size = whole
        if partial > self._max_bytes // 4:
            size = next(n for n in self._free if n != whole)
        buffers = self._free[size]
        buffers.pop(0)
        self._kept_bytes -= size
        if not buffers:
            del self._free[size]


def _touched(n_bytes: int) -> mx.array:
    """A fresh buffer, its pages touched (zeroed)."""
    buffer = mx.zeros((n_bytes,), dtype=mx.uint8)
    mx.eval(buffer)
    return buffer
