from __future__ import annotations

import os
import threading

import pytest

from semantic.application.cache.read_lanes import LaneReaders, read_lanes, usable_cpus


@pytest.mark.parametrize(("n_blocks", "lanes"), [(0, 2), (1, 2), (3, 2), (7, 2), (9, 4), (5, 1)])
def test_lanes_read_every_block_once_each_in_order(n_blocks: int, lanes: int) -> None:
    split = read_lanes(n_blocks, lanes)
    assert len(split) == min(n_blocks, lanes), "no lane without a block"
    assert sorted(i for lane in split for i in lane) == list(range(n_blocks))
    sizes = [len(lane) for lane in split]
    assert not sizes or max(sizes) - min(sizes) <= 1, "the lanes come out even"


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(usable_cpus()) < 2, reason="needs 2 CPUs"
)
def test_each_lane_reads_on_a_cpu_of_its_own() -> None:
    """Left to the kernel, a second reader woken while the first reads was often queued on
    the first one's CPU and started milliseconds late."""
    readers = LaneReaders(lanes=2)
    try:
        seen = [readers.submit(lane, _where_am_i).result() for lane in (0, 1, 0, 1)]
    finally:
        readers.shutdown()
    (thread_0, cpus_0), (thread_1, cpus_1), again_0, again_1 = seen
    assert again_0 == (thread_0, cpus_0), "one thread a lane"
    assert again_1 == (thread_1, cpus_1), "one thread a lane"
    assert len(cpus_0) == len(cpus_1) == 1
    assert cpus_0 != cpus_1
    assert os.sched_getaffinity(0) == set(usable_cpus()), "the caller's CPUs are untouched"


def _where_am_i() -> tuple[int, set[int]]:
    return threading.get_native_id(), os.sched_getaffinity(0)
