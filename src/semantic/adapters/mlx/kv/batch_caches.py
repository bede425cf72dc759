"""A decode batch's caches joined and cut with one copy each.

mlx-lm's ``BatchKVCache.merge`` sizes the batch buffer to the newcomers' positions alone
(the first decode step then grows it, copying every layer again), and ``extract``
evaluates the batch's padding again for every row and layer it cuts. Sixteen agents joining
at once took ~150 ms of the first decode step after their prefill to merge and evaluate,
and sixteen finishing together ~56 ms of the last to cut out (SmolLM2, a 2-core Zen 3 VM).
Here each layer's buffer has room up to the next ``BatchKVCache.step`` positions and is
written once (zeros, then each sequence in place), and the rows leaving in one step are
cut with one evaluation of the padding per layer and one evaluation of their caches.
Only copies: the values are mlx-lm's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from semantic.adapters.mlx.lm import BatchKVCache, KVCache


def merged_layer(layers: Sequence[Any]) -> Any:
    """One layer's batch cache from the newcomers' caches of that layer, as mlx-lm's
    ``merge`` lays it out (left-padded to the longest), with room after it up to the next
    multiple of ``BatchKVCache.step`` positions, as its own growth would make: the first
    decode step writes in place instead of copying every layer again into a bigger buffer
    (sixteen joining agents: ~75 ms of that step). mlx-lm's ``merge`` where a layer is not
    a plain, non-empty ``KVCache``."""
    if not all(type(c) is KVCache and c.keys is not None for c in layers):
        return layers[0].merge(list(layers))
    longest = max(c.offset for c in layers)
    if longest == 0:
        return layers[0].merge(list(layers))
    step = BatchKVCache.step
    size = -(-(longest + 1) // step) * step
    padding = [longest - c.offset for c in layers]
    batch: Any = BatchKVCache(padding)
    batch.keys, batch.values = (
        _laid_out([getattr(c, part) for c in layers], layers, padding, longest, size)
        for part in ("keys", "values")
    )
    batch.offset = batch.offset + longest
    batch._idx = longest  # noqa: SLF001 - BatchKVCache keeps its write index here
    return batch


def _laid_out(
    arrays: list[mx.array], layers: Sequence[Any], padding: list[int], longest: int, size: int
) -> mx.array:
    """One zeroed buffer of ``size`` positions a row, each sequence's positions written in
    after its padding (each write in place: the buffer has no other holder). Padding each
    piece and concatenating them wrote the whole buffer twice (sixteen joining agents'
    189 MB over SmolLM2's 30 layers: 42-54 ms against 21-31 ms on a 2-core Zen 5)."""
    first = arrays[0]
    buffer = mx.zeros((len(arrays), first.shape[1], size, first.shape[3]), dtype=first.dtype)
    for row, (array, cache, pad) in enumerate(zip(arrays, layers, padding, strict=True)):
        buffer[row : row + 1, :, pad:longest] = array[..., : cache.offset, :]
    return buffer


def extracted_rows(batch: Sequence[Any], rows: Sequence[int]) -> list[list[Any]]:
    """``rows``' own caches cut out of the batch's layers (as ``BatchKVCache.extract``
    cuts them), evaluated together."""
    out: list[list[Any]] = [[] for _ in rows]
    for layer in batch:
        if _plain_batch(layer):
            paddings = layer.left_padding.tolist()
            for caches, row in zip(out, rows, strict=True):
                caches.append(_row_of(layer, row, int(paddings[row])))
        else:
            for caches, row in zip(out, rows, strict=True):
                caches.append(layer.extract(row))
    mx.eval([(c.keys, c.values) for caches in out for c in caches])
    return out


def _plain_batch(layer: Any) -> bool:
    return type(layer) is BatchKVCache and layer.keys is not None


def _row_of(layer: Any, row: int, padding: int) -> Any:
    cache: Any = KVCache()  # type: ignore[no-untyped-call]  # mlx-lm: unannotated
    end = layer._idx  # noqa: SLF001 - BatchKVCache keeps its write index here
    cache.keys = mx.contiguous(layer.keys[row : row + 1, :, padding:end])
    cache.values = mx.contiguous(layer.values[row : row + 1, :, padding:end])
    cache.offset = cache.keys.shape[2]
    return cache


def adopted(caches: list[Any]) -> list[Any] | None:
    """A lone newcomer's plain caches as a batch of one that holds their buffers: merging
    copies every layer's KV into buffers with no room, so the next pass grows (copies) them
    again. A plain cache's buffer is its own (the host pass already writes into it past its
    positions; ``cache_room.clone_prefix``). None where a layer is not a plain cache."""
    if not all(type(c) is KVCache and c.keys is not None for c in caches):
        return None
    batch = []
    for cache in caches:
        adopted = BatchKVCache([0])
        adopted.keys, adopted.values = cache.keys, cache.values
        adopted.offset = adopted.offset + cache.offset
        adopted._idx = cache.offset  # noqa: SLF001 - BatchKVCache keeps its write index here
        batch.append(adopted)
    return batch


def handed_back(batch: list[Any]) -> list[Any] | None:
    """A batch of one's buffers as plain caches: ``extract`` copies the whole KV (~200 ms
    at 4K here, into memory touched for the first time), and the batch is dropped right
    after, so the buffers are the caches' own. None where a layer is not a plain batch
    cache or its row is left-padded."""
    if not all(type(layer) is BatchKVCache and layer.keys is not None for layer in batch):
        return None
    if mx.stack([layer.left_padding[0] for layer in batch]).any().item():  # one evaluation
        return None
    caches = []
    for layer in batch:
        cache = KVCache()  # type: ignore[no-untyped-call]  # mlx-lm: unannotated
        cache.keys, cache.values = layer.keys, layer.values
        cache.offset = layer._idx  # noqa: SLF001 - BatchKVCache keeps its write index here
        caches.append(cache)
    return caches


def row_views(batch: list[Any], index: int, n_tokens: int) -> list[Any] | None:
    """Row ``index``'s first ``n_tokens`` positions as plain caches that view the batch's
    buffers; None for a batch cache of another kind."""
    if not all(type(layer) is BatchKVCache for layer in batch):
        return None
    out = []
    for layer in batch:
        start = int(layer.left_padding[index].item())
        rows = slice(index, index + 1)
        out.append(_view(layer.keys[rows, :, start:], layer.values[rows, :, start:], n_tokens))
    return out


def views(caches: list[Any], n_tokens: int) -> list[Any]:
    """Plain caches' first ``n_tokens`` positions, as plain caches viewing their buffers."""
    return [_view(cache.keys, cache.values, n_tokens) for cache in caches]


def _view(keys: mx.array, values: mx.array, n_tokens: int) -> Any:
    view = KVCache()  # type: ignore[no-untyped-call]  # mlx-lm: unannotated
    view.keys, view.values = keys[..., :n_tokens, :], values[..., :n_tokens, :]
    view.offset = n_tokens
    return view
