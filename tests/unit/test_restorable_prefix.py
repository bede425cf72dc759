"""Which prefix of a stored conversation its blocks can restore, layer by layer."""

from __future__ import annotations

from semantic.domain.blocks import AgentBlocks, KVBlock, restorable_prefix
from semantic.domain.cache_spec import ModelCacheSpec

SPEC = ModelCacheSpec(
    n_layers=2,
    n_kv_heads=1,
    k_head_dim=2,
    v_head_dim=2,
    kv_dtype="float32",
    layer_windows=(6, None),
    block_tokens=4,
)


def blocks(n_tokens: int, sliding_from: int) -> AgentBlocks:
    """A global layer with every position, a sliding one from ``sliding_from`` on."""
    size = SPEC.block_tokens
    full = tuple(
        KVBlock(i, 1, i, min(size, n_tokens - i * size), None) for i in range(-(-n_tokens // size))
    )
    sliding = tuple(
        KVBlock(100 + b.index, 0, b.index, b.n_tokens, None, max(0, sliding_from - b.index * size))
        for b in full
        if (b.index + 1) * size > sliding_from
    )
    return AgentBlocks("a", tuple(range(n_tokens)), (sliding, full))


def test_a_sliding_layer_restores_where_its_window_is_whole() -> None:
    stored = blocks(20, sliding_from=14)  # held: 14..19, the window at 20
    assert restorable_prefix(stored, 20, SPEC) == 20
    # a prompt leaving the conversation at 19 needs 13..18: 13 was never kept
    assert restorable_prefix(stored, 19, SPEC) == 0
    assert restorable_prefix(stored, 12, SPEC) == 0


def test_a_sliding_layer_with_history_restores_any_length_its_history_reaches() -> None:
    stored = blocks(20, sliding_from=9)
    assert [restorable_prefix(stored, n, SPEC) for n in (20, 16, 15, 14)] == [20, 16, 15, 0]


def test_positions_from_the_start_restore_every_shorter_prefix() -> None:
    stored = blocks(10, sliding_from=0)
    assert [restorable_prefix(stored, n, SPEC) for n in (10, 3, 1, 0)] == [10, 3, 1, 0]


def test_a_hole_in_a_global_layer_ends_the_prefix_before_it() -> None:
    stored = blocks(20, sliding_from=0)
    holed = (stored.layers[0], tuple(b for b in stored.layers[1] if b.index != 3))
    assert restorable_prefix(AgentBlocks("a", stored.token_ids, holed), 20, SPEC) == 12
