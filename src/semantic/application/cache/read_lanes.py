"""How a restore's block reads are spread over threads, and how its waiter learns they ended.

Reading a block file is a kernel copy out of the page cache and a hash, both done without
the GIL, plus ~0.35 ms of Python. A restore reads in as many lanes as there are CPUs, each
lane one thread kept on its own CPU (ADR 0007): left to the kernel, the second reader was
often woken onto the CPU where the first was already reading and waited there for its
time slice, starting 1.5-4 ms late in a restore of ~6 ms.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from semantic.application.threads import NativeThreadPool

T = TypeVar("T")

READERS = 4
"""The most lanes a restore reads in, however many CPUs there are: each lane is one file at
a time, and the page cache's copies share the memory bus."""


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (all of them where the OS cannot say)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


LANES = max(1, min(READERS, len(usable_cpus())))


def read_lanes(n_blocks: int, lanes: int = LANES) -> list[range]:
    """Which blocks each lane reads, in turn: every ``lanes``-th block from each start
    (blocks are of one size but the last, so the lanes come out even)."""
    return [range(start, n_blocks, lanes) for start in range(min(n_blocks, lanes))]


class LaneReaders:
    """One reader thread per lane, each kept on a CPU of its own where the OS allows it."""

    def __init__(self, lanes: int = LANES, name: str = "semantic-read") -> None:
        cpus = usable_cpus()
        self._threads = [
            NativeThreadPool(1, f"{name}-{lane}", on_start=_stay_on(cpus, lane, lanes))
            for lane in range(lanes)
        ]

    def submit(self, lane: int, work: Callable[..., T], *args: Any) -> Future[T]:
        return self._threads[lane].submit(work, *args)

    def shutdown(self) -> None:
        for thread in self._threads:
            thread.shutdown(wait=True)


def _stay_on(cpus: list[int], lane: int, lanes: int) -> Callable[[], None] | None:
    if len(cpus) < 2 or not hasattr(os, "sched_setaffinity"):
        return None
    return functools.partial(_keep_this_thread_on, cpus[lane * len(cpus) // lanes])


def _keep_this_thread_on(cpu: int) -> None:
    with contextlib.suppress(OSError):  # not allowed here: the kernel places it as before
        os.sched_setaffinity(0, {cpu})  # 0: the calling thread, on Linux


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
