"""The start's prefault as work beside the server: the restore buffers made through the
engine's thread, one a look at the gate, then the heap; stopped where the gate says."""

from __future__ import annotations

from collections.abc import Callable

from semantic.adapters.mlx.kv.restore_buffers import RestoreBuffers
from semantic.bootstrap.model import prefault_work
from semantic.domain.cache_spec import ModelCacheSpec

SPEC = ModelCacheSpec(
    n_layers=1, n_kv_heads=1, k_head_dim=8, v_head_dim=8, kv_dtype="float32", layer_windows=(None,)
)
BLOCK = SPEC.bytes_per_token * SPEC.block_tokens


class EngineThread:
    """``EngineLoop.run_sync`` that counts what it was given to run."""

    def __init__(self) -> None:
        self.ran = 0

    def __call__(self, fn: Callable[[], int]) -> int:
        self.ran += 1
        return fn()


def gate(opens: int) -> Callable[[], bool]:
    answers = iter([True] * opens)
    return lambda: next(answers, False)


def test_the_buffers_are_made_on_the_engines_thread_up_to_their_cap() -> None:
    buffers, engine = RestoreBuffers(3 * BLOCK), EngineThread()
    prefault_work(8 * BLOCK, SPEC, buffers, engine)(lambda: True)
    assert engine.ran == 3
    assert buffers.kept_bytes == 3 * BLOCK


def test_a_closed_gate_stops_the_prefault_between_two_buffers() -> None:
    buffers, engine = RestoreBuffers(3 * BLOCK), EngineThread()
    prefault_work(8 * BLOCK, SPEC, buffers, engine)(gate(2))
    assert engine.ran == 2
    assert buffers.kept_bytes == 2 * BLOCK


def test_an_engine_that_no_longer_answers_ends_the_prefault() -> None:
    buffers = RestoreBuffers(3 * BLOCK)

    def stopped(_fn: Callable[[], int]) -> int:
        raise TimeoutError

    prefault_work(8 * BLOCK, SPEC, buffers, stopped)(lambda: True)
    assert buffers.kept_bytes == 0
