"""A restored prefix that the host pass reads where it lies, before any cache is built.

A returning agent's KV comes back as blocks, each in one buffer (the one its file was read
into, or the one its sequence was cut into when it finished). Copying them into one cache
buffer per layer (``gather_cache``) took ~32 ms at 4,000 tokens, all of it before the first
new token. When the agent's new tokens fit a few host passes (ADR 0013), those passes read
the blocks in place instead (each block's rows of one kv head are contiguous), and write
the new tokens' KV into a small cache of its own. The copy into one buffer then happens on the
next decode step, after the first token is out.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from semantic.adapters.mlx.kv.kv_blocks import block_slices
from semantic.adapters.mlx.kv.kv_payloads import host_rows
from semantic.domain.blocks import AgentBlocks
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.errors import IncompatibleCacheError


class Segment(ctypes.Structure):
    """``segment_t`` of ``native/llama_pass.c``."""

    _fields_ = [
        ("keys", ctypes.c_void_p),
        ("values", ctypes.c_void_p),
        ("length", ctypes.c_int),
        ("k_head", ctypes.c_long),
        ("v_head", ctypes.c_long),
    ]


@dataclass(frozen=True, slots=True)
class RestoredPrefix:
    """The first ``n_tokens`` positions of ``blocks``, as per-layer segment tables."""

    blocks: AgentBlocks
    n_tokens: int
    n_segments: int
    tables: Any
    """``const segment_t *[layers]``: every layer has ``n_segments`` segments."""
    kept: list[Any]
    """The numpy views and ctypes arrays the tables point into (and so the buffers)."""

    @classmethod
    def of(cls, blocks: AgentBlocks, n_tokens: int, spec: ModelCacheSpec) -> RestoredPrefix | None:
        """None where a layer is not plain float32 blocks with contiguous rows (a sliding
        window, a quantized block decoded elsewhere)."""
        if n_tokens <= 0 or any(spec.window(i) is not None for i in range(spec.n_layers)):
            return None
        if len(blocks.layers) != spec.n_layers or spec.k_head_dim != spec.v_head_dim:
            return None
        buffers: dict[int, np.ndarray] = {}
        kept: list[Any] = [buffers]
        tables = []
        for layer_blocks in blocks.layers:
            segments = _segments(layer_blocks, n_tokens, spec, buffers, kept)
            if segments is None:
                return None
            tables.append((Segment * len(segments))(*segments))
        if len({len(table) for table in tables}) != 1:
            return None
        kept += tables
        pointers = (ctypes.c_void_p * len(tables))(*(ctypes.addressof(t) for t in tables))
        kept.append(pointers)
        return cls(blocks, n_tokens, len(tables[0]), pointers, kept)


def _segments(
    layer_blocks: Any,
    n_tokens: int,
    spec: ModelCacheSpec,
    buffers: dict[int, np.ndarray],
    kept: list[Any],
) -> list[Segment] | None:
    segments = []
    try:
        for block, positions in block_slices(layer_blocks, 0, n_tokens, spec):
            rows = host_rows(block.payload, positions, buffers)
            if rows is None or not all(_plain_rows(a, spec) for a in rows):
                return None
            keys, values = rows
            kept.append(block.payload)  # its restore buffer's lease
            segments.append(
                Segment(
                    keys.ctypes.data,
                    values.ctypes.data,
                    keys.shape[1],
                    keys.strides[0] // 4,
                    values.strides[0] // 4,
                )
            )
    except IncompatibleCacheError:  # a position missing: the cache build will say so
        return None
    return segments


def _plain_rows(array: np.ndarray, spec: ModelCacheSpec) -> bool:
    """(kv_heads, n, dim) float32 with each head's rows back to back."""
    return (
        array.ndim == 3
        and array.shape[0] == spec.n_kv_heads
        and array.shape[2] == spec.k_head_dim
        and array.dtype == np.float32
        and array.strides[2] == 4
        and array.strides[1] == 4 * array.shape[2]
        and array.strides[0] > 0
    )
