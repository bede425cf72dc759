"""The heap's prefault: touched in chunks, and stopped between two when told."""

from __future__ import annotations

import sys

import pytest

from semantic.adapters.mlx.cpu.memory import prefault_heap, tune_malloc

CHUNK = 1 << 20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc only")
def test_the_prefault_stops_where_it_is_told_and_says_how_much_it_touched() -> None:
    if not tune_malloc():  # here, not at collection: it tunes this whole process's malloc
        pytest.skip("malloc could not be tuned (not glibc)")
    answers = iter([True, True, False, True])
    assert prefault_heap(4 * CHUNK, CHUNK, go_ahead=lambda: next(answers)) == 2 * CHUNK
    assert prefault_heap(3 * CHUNK, CHUNK) == 3 * CHUNK
