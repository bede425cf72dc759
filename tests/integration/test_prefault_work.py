"""The start's prefault as work beside the server: the restore buffers made on the engine's
thread, each once it is idle, then the heap; stopped where the gate or the engine says."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator

import pytest

from semantic.adapters.mlx.kv.restore_buffers import RestoreBuffers
from semantic.application.engine.engine_loop import EngineLoop
from semantic.bootstrap.prefault import prefault_work
from semantic.domain.cache_spec import ModelCacheSpec
from tests.unit.fakes import FakeBackend
from tests.unit.test_engine_loop import small_engine

SPEC = ModelCacheSpec(
    n_layers=1, n_kv_heads=1, k_head_dim=8, v_head_dim=8, kv_dtype="float32", layer_windows=(None,)
)
BLOCK = SPEC.bytes_per_token * SPEC.block_tokens


class EngineThread:
    """A real engine loop's ``run_sync``, remembering the threads it ran on."""

    def __init__(self, loop: EngineLoop) -> None:
        self.loop = loop
        self.threads: list[str] = []

    def __call__(self, fn: Callable[[], int]) -> int:
        def named() -> int:
            self.threads.append(threading.current_thread().name)
            return fn()

        return self.loop.run_sync(named, timeout=30)


@pytest.fixture
def engine() -> Iterator[EngineThread]:
    loop = EngineLoop(small_engine(FakeBackend()))
    loop.start()
    yield EngineThread(loop)
    loop.stop()


def gate(opens: int) -> Callable[[], bool]:
    answers = iter([True] * opens)
    return lambda: next(answers, False)


def test_the_buffers_are_made_on_the_engines_thread_up_to_their_cap(engine: EngineThread) -> None:
    buffers = RestoreBuffers(3 * BLOCK)
    prefault_work(8 * BLOCK, SPEC, buffers, engine, idle=lambda: True)(lambda: True)
    assert engine.threads == ["semantic-engine"] * 3
    assert buffers.kept_bytes == 3 * BLOCK


def test_buffers_given_back_meanwhile_count_against_the_cap(engine: EngineThread) -> None:
    buffers = RestoreBuffers(3 * BLOCK)
    buffers.give_back(buffers.take(BLOCK))  # a restore's, returned before the prefault
    prefault_work(8 * BLOCK, SPEC, buffers, engine, idle=lambda: True)(lambda: True)
    assert buffers.kept_bytes == 3 * BLOCK
    assert engine.threads.count("semantic-engine") == 3  # two made, the third found none


def test_a_busy_engine_gets_no_buffer_until_the_gate_closes(engine: EngineThread) -> None:
    buffers = RestoreBuffers(3 * BLOCK)
    prefault_work(8 * BLOCK, SPEC, buffers, engine, idle=lambda: False)(gate(5))
    assert engine.threads == []
    assert buffers.kept_bytes == 0


def test_a_closed_gate_stops_the_prefault_between_two_buffers(engine: EngineThread) -> None:
    buffers = RestoreBuffers(3 * BLOCK)
    prefault_work(8 * BLOCK, SPEC, buffers, engine, idle=lambda: True)(gate(2))
    assert engine.threads == ["semantic-engine"] * 2
    assert buffers.kept_bytes == 2 * BLOCK


def test_a_stopped_engine_ends_the_prefault(engine: EngineThread) -> None:
    buffers = RestoreBuffers(3 * BLOCK)
    engine.loop.stop()
    work = prefault_work(8 * BLOCK, SPEC, buffers, engine, idle=lambda: True)
    work(functools.partial(bool, True))
    assert buffers.kept_bytes == 0
