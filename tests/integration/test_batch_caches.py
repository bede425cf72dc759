"""A decode batch's caches joined and cut by ``kv/batch_caches.py`` hold what mlx-lm's own
``BatchKVCache.merge`` and ``extract`` give, bit for bit (they only copy)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from semantic.adapters.mlx.kv.batch_caches import extracted_rows, merged_layer
from semantic.adapters.mlx.lm import BatchKVCache, KVCache


def _cache(positions: int, room: int, seed: int) -> Any:
    """A plain cache holding ``positions`` of random KV in a buffer with ``room`` more."""
    rng = np.random.default_rng(seed)
    cache: Any = KVCache()  # type: ignore[no-untyped-call]  # mlx-lm: unannotated
    shape = (1, 3, positions + room, 8)
    cache.keys = mx.array(rng.standard_normal(shape).astype(np.float32))
    cache.values = mx.array(rng.standard_normal(shape).astype(np.float32))
    cache.offset = positions
    return cache


def _same(a: mx.array, b: mx.array) -> bool:
    return a.shape == b.shape and np.array_equal(np.asarray(a), np.asarray(b))


def test_a_merged_layer_is_mlx_lms_merge_with_room_after_it() -> None:
    caches = [_cache(5, 3, 1), _cache(9, 0, 2), _cache(1, 7, 3)]
    mine, theirs = merged_layer(caches), BatchKVCache.merge(caches)  # type: ignore[no-untyped-call]  # mlx-lm: unannotated
    assert mine.keys.shape[2] == BatchKVCache.step
    assert _same(mine.keys[..., :9, :], theirs.keys)
    assert _same(mine.values[..., :9, :], theirs.values)
    assert not np.asarray(mine.keys[..., 9:, :]).any()
    assert mine.left_padding.tolist() == theirs.left_padding.tolist() == [4, 0, 8]
    assert mine.offset.tolist() == theirs.offset.tolist()
    assert mine.size() == theirs.size() == 9


def test_rows_cut_out_together_are_what_extract_cuts() -> None:
    batch = [
        merged_layer([_cache(5, 3, s), _cache(9, 0, s + 1), _cache(2, 1, s + 2)]) for s in (1, 4)
    ]
    for layer in batch:  # one decode step's worth of KV written after the merge
        layer.update_and_fetch(mx.ones((3, 3, 1, 8)), mx.ones((3, 3, 1, 8)))
    rows = extracted_rows(batch, [0, 2])
    for caches, row in zip(rows, [0, 2], strict=True):
        for mine, layer in zip(caches, batch, strict=True):
            theirs = layer.extract(row)
            assert _same(mine.keys, theirs.keys)
            assert _same(mine.values, theirs.values)
            assert mine.offset == theirs.offset
    assert [c.offset for c in rows[1]] == [3, 3]
