"""Room in a sequence's caches before its positions arrive: buffers sized once for a
prompt, and private copies of a prefix with room to go on.

mlx-lm's plain ``KVCache`` grows its buffers by ``GROWTH_STEP`` positions when full, copying
everything it holds; the engine knows a prompt's length before its first chunk, so it sizes
them once (``reserve_room``), and the host pass, which writes into a cache's buffer in
place, gets clones with room of their own (``clone_prefix``).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from semantic.adapters.mlx.kv.kv_blocks import DTYPE_NAMES
from semantic.adapters.mlx.lm import KVCache
from semantic.domain.cache_spec import ModelCacheSpec

GROWTH_STEP = 256
"""mlx-lm's caches grow in steps of this many positions."""


def reserve_room(caches: list[Any], room: int, spec: ModelCacheSpec) -> None:
    """Buffers for ``room`` positions in empty plain caches, before a prompt's first chunk.

    Left to grow by themselves, they copy everything they hold every 256 positions: a
    4,000-token prompt prefilled in small chunks copied ~1.5 GB, in steps of up to 30 ms
    that landed in single rounds beside running streams.
    """
    room = room_to_reserve(caches, room)
    if room:
        for cache in caches:
            size_cache(cache, room, spec)
        mx.eval([(c.keys, c.values) for c in caches])


def room_to_reserve(caches: list[Any], room: int) -> int:
    """``room`` where the caches are empty plain ones that would grow more than once, else 0
    (a cache holding positions, or a rotating one, sizes itself)."""
    if room <= GROWTH_STEP or not all(type(c) is KVCache and c.keys is None for c in caches):
        return 0
    return room


def size_cache(cache: Any, room: int, spec: ModelCacheSpec) -> None:
    """Zeroed (lazy) buffers for ``room`` positions, rounded up to the growth step, in one
    empty plain cache (a cache already holding a buffer is left as it is)."""
    if cache.keys is not None:
        return
    dtype = next(d for d, name in DTYPE_NAMES.items() if name == spec.kv_dtype)
    shape = (1, spec.n_kv_heads, -(-room // GROWTH_STEP) * GROWTH_STEP)
    cache.keys = mx.zeros((*shape, spec.k_head_dim), dtype=dtype)
    cache.values = mx.zeros((*shape, spec.v_head_dim), dtype=dtype)


def clone_prefix(caches: list[Any], n_tokens: int, room: int) -> list[Any] | None:
    """New plain caches holding the first ``n_tokens`` positions of ``caches``, in buffers
    of their own with room for ``room`` more: the host pass writes into a cache's buffer in
    place, so a clone never shares one. None unless every cache is a plain one holding
    those positions."""
    if not all(type(c) is KVCache and c.keys is not None and c.offset >= n_tokens for c in caches):
        return None
    capacity = -(-(n_tokens + room) // GROWTH_STEP) * GROWTH_STEP
    clones = []
    for cache in caches:
        clone = KVCache()  # type: ignore[no-untyped-call]  # mlx-lm: unannotated
        clone.keys = _copied(cache.keys, n_tokens, capacity)
        clone.values = _copied(cache.values, n_tokens, capacity)
        clone.offset = n_tokens
        clones.append(clone)
    mx.eval([(c.keys, c.values) for c in clones])
    return clones


def _copied(buffer: mx.array, n_tokens: int, capacity: int) -> mx.array:
    batch, heads, _, dim = buffer.shape
    tail = mx.zeros((batch, heads, capacity - n_tokens, dim), dtype=buffer.dtype)
    return mx.concatenate([buffer[..., :n_tokens, :], tail], axis=2)
