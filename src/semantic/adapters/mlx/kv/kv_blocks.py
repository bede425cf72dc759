"""Cut mlx-lm caches into 256-token blocks and gather blocks back into caches.

Two cache kinds are supported: ``KVCache`` (global attention) and ``RotatingKVCache`` with
``keep=0`` (sliding-window attention, as in Gemma 3). Blocks hold ``kv_payloads``; since a
``StackedKV``'s buffer is reused once the payload is gone, ``gather_cache`` always copies.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from semantic.adapters.mlx.errors import UnsupportedModelError
from semantic.adapters.mlx.kv.kv_payloads import HOST_DTYPES, MlxKV, StackedKV, kv_arrays
from semantic.adapters.mlx.kv.restore_buffers import RestoreBuffers
from semantic.adapters.mlx.lm import KVCache, RotatingKVCache, make_prompt_cache
from semantic.domain.blocks import AgentBlocks, KVBlock
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.errors import IncompatibleCacheError
from semantic.ports.model_backend import BlockPayload

DTYPE_NAMES = {mx.float32: "float32", mx.float16: "float16", mx.bfloat16: "bfloat16"}
"""MLX dtypes by the names a ``ModelCacheSpec`` gives them."""


def spec_from_model(model: Any) -> ModelCacheSpec:
    """Read the cache geometry off the model by running one token through a fresh cache."""
    caches = make_prompt_cache(model)
    windows: list[int | None] = []
    for layer, cache in enumerate(caches):
        if type(cache) is KVCache:
            windows.append(None)
        elif type(cache) is RotatingKVCache and cache.keep == 0:
            windows.append(int(cache.max_size))
        else:  # recurrent state (ArraysCache), or KV that is not kept position by position
            kind = type(cache).__name__
            raise UnsupportedModelError(
                f"cannot serve this model: its layer {layer} uses mlx-lm's {kind}, which "
                "cannot be cut into blocks of positions (recurrent or hybrid layers); semantic "
                "serves models whose every layer keeps a KVCache, or a RotatingKVCache with "
                "keep=0 (sliding-window attention)"
            )
    model(mx.array([[0]]), cache=caches)
    keys, values = caches[0].state[:2]
    mx.eval(keys, values)
    return ModelCacheSpec(
        n_layers=len(caches),
        n_kv_heads=int(keys.shape[1]),
        k_head_dim=int(keys.shape[3]),
        v_head_dim=int(values.shape[3]),
        kv_dtype=DTYPE_NAMES[keys.dtype],
        layer_windows=tuple(windows),
    )


HISTORY_SLACK = 64
"""Positions a sliding layer's history keeps beyond its window (``window_history``)."""

History = list[tuple[mx.array, mx.array, int] | None]
"""Per layer: a sliding layer's keys and values at the end of its prompt, in position
order, and the position of their first entry; None for a global layer."""


def window_history(caches: Sequence[Any], spec: ModelCacheSpec) -> History:
    """What each sliding layer holds once its prompt is in (its window, and up to
    ``HISTORY_SLACK`` positions before it), copied before decoding rotates it away.

    A sliding layer's cache ends a turn holding only the window before the reply's last
    token, so a next turn that leaves the stored conversation anywhere earlier (a reply
    tokenized otherwise when sent back, or cut by the template; the same prompt again)
    needs positions the blocks no longer have, and computes its whole prompt. Kept with
    the blocks, this history lets it continue from any point of the reply, and from a few
    tokens before it, while the reply is no longer than the window."""
    out: History = []
    for layer, cache in enumerate(caches):
        window = spec.window(layer)
        if window is None or not isinstance(cache, RotatingKVCache) or cache.keys is None:
            out.append(None)
            continue
        keys, values, first = _ordered_kv(cache)
        held = min(int(keys.shape[2]), window + HISTORY_SLACK)
        start = int(keys.shape[2]) - held
        kept = mx.contiguous(keys[..., start:, :]), mx.contiguous(values[..., start:, :])
        out.append((*kept, first + start))
    mx.eval([entry[:2] for entry in out if entry is not None])
    return out


def cut_into_blocks(
    caches: Sequence[Any],
    keep_tokens: int,
    spec: ModelCacheSpec,
    buffers: RestoreBuffers | None = None,
    history: History | None = None,
) -> list[list[BlockPayload]]:
    """The first ``keep_tokens`` positions of each layer's cache, as block payloads; a
    sliding layer's ``history`` goes in front of what its cache still holds where the two
    meet.

    With ``buffers``, caches alike in every layer are copied by numpy into one buffer per
    block, laid out as its file (``StackedKV``): one MLX copy per layer and block took 51 ms
    for a 4,000-token conversation (960 small ops; two copy streams did not help), in the
    round where its request ended, a gap for every other stream."""
    if buffers is not None and _stackable(caches, keep_tokens):
        return _cut_stacked(caches, keep_tokens, spec, buffers)
    out: list[list[BlockPayload]] = []
    arrays: list[mx.array] = []
    for layer, cache in enumerate(caches):
        keys, values, first_position = _with_history(
            _ordered_kv(cache), history[layer] if history is not None else None
        )
        if keep_tokens > cache.offset:
            raise IncompatibleCacheError(
                f"asked to keep {keep_tokens} positions of a cache holding {cache.offset}"
            )
        payloads: list[BlockPayload] = []
        end = keep_tokens
        start = max(first_position, 0)
        index = start // spec.block_tokens
        while index * spec.block_tokens < end:
            lo = max(index * spec.block_tokens, start)
            hi = min((index + 1) * spec.block_tokens, end)
            if lo < hi:
                a, b = lo - first_position, hi - first_position
                kv = MlxKV(mx.contiguous(keys[..., a:b, :]), mx.contiguous(values[..., a:b, :]))
                arrays += (kv.keys, kv.values)
                payloads.append(
                    BlockPayload(
                        index=index,
                        start=lo - index * spec.block_tokens,
                        n_tokens=hi - index * spec.block_tokens,
                        data=kv,
                    )
                )
            index += 1
        out.append(payloads)
    mx.eval(arrays)
    return out


def _stackable(caches: Sequence[Any], keep_tokens: int) -> bool:
    """Plain caches of a host dtype, every layer's keys and values alike in shape."""
    shapes = set()
    for cache in caches:
        if type(cache) is not KVCache or keep_tokens > cache.offset:
            return False
        if cache.keys is not None and cache.keys.shape[0] != 1:  # one sequence per cache
            return False
        if cache.keys is None or cache.values is None:
            return False
        if cache.keys.dtype not in HOST_DTYPES or cache.values.dtype != cache.keys.dtype:
            return False
        shapes |= {(a.shape[1], a.shape[3]) for a in (cache.keys, cache.values)}
    return len(shapes) == 1


def _cut_stacked(
    caches: Sequence[Any], keep_tokens: int, spec: ModelCacheSpec, buffers: RestoreBuffers
) -> list[list[BlockPayload]]:
    dtype = caches[0].keys.dtype
    host_dtype = HOST_DTYPES[dtype]
    heads, dim = caches[0].keys.shape[1], caches[0].keys.shape[3]
    sources = [(np.asarray(c.keys)[0], np.asarray(c.values)[0]) for c in caches]
    out: list[list[BlockPayload]] = [[] for _ in caches]
    size = spec.block_tokens
    for index in range(-(-keep_tokens // size)):
        lo, hi = index * size, min((index + 1) * size, keep_tokens)
        shape = (2 * len(caches), heads, hi - lo, dim)
        buffer = buffers.take(int(np.prod(shape)) * np.dtype(host_dtype).itemsize)
        lease = buffers.lease(buffer)  # gives the buffer back even if a copy fails
        stack = np.asarray(buffer).view(host_dtype).reshape(shape)
        for layer, (keys, values) in enumerate(sources):
            np.copyto(stack[2 * layer], keys[:, lo:hi])
            np.copyto(stack[2 * layer + 1], values[:, lo:hi])
        for layer in range(len(caches)):
            kv = StackedKV(buffer, dtype, shape, 2 * layer, 2 * layer + 1, lease)
            out[layer].append(BlockPayload(index=index, start=0, n_tokens=hi - lo, data=kv))
    return out


def gather_cache(
    model: Any,
    blocks: AgentBlocks | None,
    n_tokens: int,
    room: int,
    spec: ModelCacheSpec,
    *,
    streams: Sequence[Any] = (),
    tails: Sequence[Any] | None = None,
) -> list[Any]:
    """Fresh per-layer caches holding the first ``n_tokens`` positions of ``blocks``.

    Each layer is built with one concatenation, with ``room`` extra zeroed positions so the
    prefill that follows writes in place instead of growing (and copying) the buffer. Layers
    are spread over ``streams`` (MLX runs each CPU stream on its own thread), so the copy
    uses every core. ``tails``: plain caches holding the positions after ``n_tokens`` (what
    the host pass computed over a restored prefix read in place); their whole buffers
    follow the blocks' positions instead of ``room``.
    """
    caches = make_prompt_cache(model)
    if blocks is None or n_tokens == 0:
        return caches if tails is None else list(tails)
    streams = streams or (mx.default_stream(mx.cpu),)
    # Views of restored buffers, one set per stream: a view made on one stream and read on
    # the other would make the two copy threads wait on each other.
    stacks: list[dict[int, mx.array]] = [{} for _ in streams]
    for layer, cache in enumerate(caches):
        window = spec.window(layer)
        first = 0 if window is None else max(0, n_tokens - window)
        layer_room = room if window is None else 0  # a rotating cache sizes its own buffer
        lane = layer % len(streams)
        tail = tails[layer] if tails is not None else None
        with mx.stream(streams[lane]):
            keys, values = _concat_positions(
                blocks.layers[layer],
                first,
                n_tokens,
                layer_room,
                spec,
                stacks=stacks[lane],
                tail=tail,
            )
        cache.keys, cache.values, cache.offset = keys, values, n_tokens
        if tail is not None:
            cache.offset += tail.offset
        if isinstance(cache, RotatingKVCache):
            cache._idx = n_tokens - first  # noqa: SLF001 - its write cursor, as from_state sets it
    mx.eval([c.state[:2] for c in caches])
    return caches


def block_slices(
    layer_blocks: Sequence[KVBlock], first: int, end: int, spec: ModelCacheSpec
) -> Iterator[tuple[KVBlock, slice]]:
    """The blocks holding positions ``first .. end - 1`` of one layer, in order, each with
    the slice of its payload's positions that falls in that range. Raises
    ``IncompatibleCacheError`` if a position is missing."""
    covered = first
    for block in layer_blocks:
        base = block.index * spec.block_tokens
        lo, hi = max(base + block.start, covered), min(base + block.n_tokens, end)
        if hi <= lo:
            continue
        if lo != covered:
            raise IncompatibleCacheError(
                f"layer {block.layer} is missing positions {covered}..{lo - 1}"
            )
        yield block, slice(lo - base - block.start, hi - base - block.start)
        covered = hi
    if covered != end:
        raise IncompatibleCacheError(f"blocks cover positions up to {covered}, not {end}")


def _concat_positions(
    layer_blocks: Sequence[KVBlock],
    first: int,
    end: int,
    room: int,
    spec: ModelCacheSpec,
    *,
    stacks: dict[int, mx.array],
    tail: Any = None,
) -> tuple[mx.array, mx.array]:
    keys: list[mx.array] = []
    values: list[mx.array] = []
    for block, positions in block_slices(layer_blocks, first, end, spec):
        block_keys, block_values = kv_arrays(block.payload, positions, stacks)
        keys.append(block_keys)
        values.append(block_values)
    if tail is not None and tail.keys is not None:
        keys.append(tail.keys)
        values.append(tail.values)
    elif room > 0:
        shape = (1, spec.n_kv_heads, room)
        keys.append(mx.zeros((*shape, spec.k_head_dim), dtype=keys[0].dtype))
        values.append(mx.zeros((*shape, spec.v_head_dim), dtype=values[0].dtype))
    if len(keys) == 1:  # concatenate would hand back the block's own memory
        return mx.array(keys[0]), mx.array(values[0])
    return mx.concatenate(keys, axis=2), mx.concatenate(values, axis=2)


def _with_history(
    held: tuple[Any, Any, int], history: tuple[mx.array, mx.array, int] | None
) -> tuple[Any, Any, int]:
    """A layer's positions in order, from its history's first one where the history
    reaches the first position the cache still holds (else the cache's alone)."""
    keys, values, first = held
    if history is None:
        return held
    old_keys, old_values, old_first = history
    if not old_first < first <= old_first + int(old_keys.shape[2]):
        return held
    cut = first - old_first
    return (
        mx.concatenate([old_keys[..., :cut, :], keys], axis=2),
        mx.concatenate([old_values[..., :cut, :], values], axis=2),
        old_first,
    )


def _ordered_kv(cache: Any) -> tuple[Any, Any, int]:
    """Keys and values in position order, and the position of their first entry."""
    if type(cache) is KVCache:
        return cache.keys, cache.values, 0
    if isinstance(cache, RotatingKVCache):
        rotating: Any = cache  # mlx-lm leaves _temporal_order untyped
        keys = rotating._temporal_order(cache.keys)  # noqa: SLF001 - mlx-lm's own reordering
        values = rotating._temporal_order(cache.values)  # noqa: SLF001
        length = min(int(keys.shape[2]), cache.offset)
        keys, values = keys[..., -length:, :], values[..., -length:, :]
        return keys, values, cache.offset - length
    raise IncompatibleCacheError(f"cannot cut a {type(cache).__name__} into blocks")
