"""A decode batch's buffers grown ahead (``cache_growth``), apart from any model."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from semantic.adapters.mlx.kv.cache_growth import GrowAhead
from semantic.adapters.mlx.lm import BatchKVCache

LAYERS, WRITTEN = 4, 200


def batch_on(buffers: list[tuple[mx.array, mx.array]]) -> list[Any]:
    """A batch of one row holding ``WRITTEN`` positions in ``buffers`` (256 wide)."""
    caches = []
    for keys, values in buffers:
        cache: Any = BatchKVCache([0])
        cache.keys, cache.values = keys, values
        cache.offset = cache.offset + WRITTEN
        cache._idx = WRITTEN  # noqa: SLF001 - BatchKVCache keeps its write index here
        caches.append(cache)
    return caches


def filled(buffers: list[tuple[mx.array, mx.array]], value: float) -> None:
    for keys, values in buffers:
        np.asarray(keys)[...] = value
        np.asarray(values)[...] = value


def test_a_new_batch_on_a_dropped_batchs_addresses_grows_from_its_own_kv() -> None:
    """MLX's allocator hands a freed buffer to the next request of its size, so a batch
    dropped while its next buffers were being made can be followed by one whose buffers
    lie at the very same addresses. That batch must not switch in copies of the old KV."""
    buffers = [(mx.zeros((1, 2, 256, 64)), mx.zeros((1, 2, 256, 64))) for _ in range(LAYERS)]
    mx.eval(buffers)
    growth = GrowAhead(step=256, lead=64)
    filled(buffers, 1.0)
    old = batch_on(buffers)
    growth.before_step(old, WRITTEN, 1)  # 56 positions of room: the first layer's copy made
    del old  # the batch is dropped; its buffers are "freed" and come back below
    filled(buffers, 2.0)
    new = batch_on(buffers)
    for _ in range(2 * LAYERS):
        growth.before_step(new, WRITTEN, 1)
    assert all(c.keys.shape[2] == 512 for c in new)  # grown and switched
    for cache in new:
        for grown in (cache.keys, cache.values):
            assert np.all(np.asarray(grown)[:, :, :WRITTEN] == 2.0)


def test_long_buffers_grow_by_a_quarter_in_whole_steps() -> None:
    """Up to 2,048 positions a growth adds one step; past them a quarter of the capacity,
    so a long decode copies its KV into new buffers a bounded number of times."""
    growth = GrowAhead(step=256, lead=64)
    added = {capacity: growth.extra(capacity) for capacity in (256, 1792, 2048, 3000, 8192)}
    assert added == {256: 256, 1792: 256, 2048: 512, 3000: 512, 8192: 2048}
