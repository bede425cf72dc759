"""How a restore's block reads are spread over threads, and how its waiter learns they ended.

Reading a block file is a kernel copy out of the page cache and a hash, both done without
the GIL, plus ~0.35 ms of Python; the split between tasks decides how well both cores stay
busy (ADR 0007).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

# Block reads run at once. More than the cores: each read is one file, so with as many
# readers as cores a three-block restore reads its third file on one core while the other
# idles; with more, the kernel shares both cores among all three (691 tokens restored from
# the page cache: 8.6 -> 7.3 ms, 1,228: 14.1 -> 11.4 ms).
READERS = 4
READ_LANES = max(1, min(READERS, os.cpu_count() or 2))
"""A restore of more than ``READERS`` files reads them in this many runs of files, one task
each, as many as the cores: four threads over 31 files on two cores spent the difference
waiting for the CPU and the GIL (7,680 tokens: 41-42 ms, 34-38 ms in two runs)."""


def read_lanes(n_blocks: int) -> list[range]:
    """Which blocks each read task takes, in turn: one each while there are no more than
    ``READERS``, else every ``READ_LANES``-th block from each of ``READ_LANES`` starts
    (blocks are of one size but the last, so the lanes come out even)."""
    if n_blocks <= READERS:
        return [range(index, index + 1) for index in range(n_blocks)]
    return [range(start, n_blocks, READ_LANES) for start in range(READ_LANES)]


def in_order(lanes: list[range], results: list[list[T]]) -> list[T]:
    """The lanes' results back in block order."""
    out: dict[int, T] = {}
    for lane, outcomes in zip(lanes, results, strict=True):
        out.update(zip(lane, outcomes, strict=True))
    return [out[index] for index in sorted(out)]


def when_all_done(futures: list[Future[Any]]) -> Future[None]:
    """A future done once all of ``futures`` are, however each ended: the event loop is woken
    once per restore, not once per block (each wake-up takes the GIL from the readers)."""
    done: Future[None] = Future()
    remaining = [len(futures)]
    lock = threading.Lock()

    def one_done(_: Future[Any]) -> None:
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            done.set_result(None)

    if not futures:
        done.set_result(None)
    for future in futures:
        future.add_done_callback(one_done)
    return done
