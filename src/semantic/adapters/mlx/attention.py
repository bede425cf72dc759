"""Attention with its softmax in numpy, for MLX on a CPU.

MLX's CPU ``exp`` runs about 60 million values a second here; numpy's vectorised one about
1.4 billion. At long contexts the softmax over the scores dominates a forward pass (a
256-token chunk at 1,792 tokens of context spent 2.4 of its 3.4 s there), so this module
keeps the matmuls on MLX (and so on OpenBLAS) and does the masking and softmax in place,
in numpy, on the evaluated scores: the scores array is fresh and owned by nobody else, so
numpy writes straight into MLX's buffer. Only llama-family attention is wrapped, only for
float32 on a CPU; everything else keeps mlx-lm's own ``scaled_dot_product_attention``.
ADR 0008 has the measurements.
"""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx
import numpy as np
from mlx import nn
from mlx_lm.models import llama

NAME = "host-softmax-v1"
"""Goes into the model fingerprint: KV computed by different attention code is not mixed."""

_NEG_INF = np.float32(-np.inf)

QKV = tuple[mx.array, mx.array, mx.array]
"""Projected queries, keys and values, one row per token."""


def install(model: Any) -> bool:
    """Swap each llama attention module for one with the host softmax (CPU, float32)."""
    if mx.default_device() != mx.cpu or getattr(model, "model_type", None) != "llama":
        return False
    layers = model.model.layers
    if not all(type(layer.self_attn) is llama.Attention for layer in layers):
        return False
    for layer in layers:
        layer.self_attn = HostSoftmaxAttention(layer.self_attn)
    return True


class HostSoftmaxAttention(nn.Module):  # type: ignore[misc,name-defined]  # mlx.nn ships no types
    """mlx-lm's llama attention (its projections and RoPE), with ``attend`` for the core."""

    def __init__(self, inner: llama.Attention) -> None:
        super().__init__()
        self.inner = inner

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        batch, length, _ = x.shape
        mixed = self.attend_projected(self.project(x), (batch, length), mask, cache)
        return self.inner.o_proj(mixed)  # type: ignore[no-any-return]

    def project(self, x: mx.array) -> QKV:
        """Queries, keys and values of ``x``'s rows (a fused pass projects several
        sequences' rows in one product each)."""
        a = self.inner
        return a.q_proj(x), a.k_proj(x), a.v_proj(x)

    def attend_projected(self, qkv: QKV, shape: tuple[int, int], mask: Any, cache: Any) -> mx.array:
        """RoPE, the cache update and attention for one sequence group's projected rows;
        returns ``(batch, length, heads * head_dim)``, ready for the output projection."""
        a = self.inner
        (q, k, v), (batch, length) = qkv, shape
        queries = q.reshape(batch, length, a.n_heads, -1).transpose(0, 2, 1, 3)
        keys = k.reshape(batch, length, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
        values = v.reshape(batch, length, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
        offset = cache.offset if cache is not None else 0
        queries = a.rope(queries, offset=offset)
        keys = a.rope(keys, offset=offset)
        if cache is not None:
            keys, values = cache.update_and_fetch(keys, values)
        out = attend(queries, keys, values, a.scale, mask)
        return out.transpose(0, 2, 1, 3).reshape(batch, length, -1)


def attend(
    queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask: Any
) -> mx.array:
    """Scaled dot-product attention with grouped KV heads; ``mask`` as mlx-lm passes it:
    None, ``"causal"``, or a boolean array (True = attend) broadcastable to the scores."""
    if queries.dtype != mx.float32:
        return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)
    batch, q_heads, length, dim = queries.shape
    kv_heads, span = keys.shape[1], keys.shape[2]
    group = q_heads // kv_heads
    grouped = (queries * scale).reshape(batch, kv_heads, group * length, dim)
    scores = grouped @ keys.swapaxes(-1, -2)
    mx.eval(scores)
    host = np.asarray(scores).reshape(batch, kv_heads, group, length, span)
    _mask_in_place(host, mask, length, span)
    peak = host.max(axis=-1, keepdims=True)
    padded = mask is not None and not isinstance(mask, str)
    if padded:  # a left-padding row attends to nothing: zeros, not NaN (0 * NaN poisons @ v)
        peak[np.isneginf(peak)] = 0.0
    host -= peak
    np.exp(host, out=host)
    total = host.sum(axis=-1, keepdims=True)
    if padded:
        total[total == 0.0] = 1.0
    host /= total
    return (scores @ values).reshape(batch, q_heads, length, dim)


def _mask_in_place(host: np.ndarray, mask: Any, length: int, span: int) -> None:
    if mask is None:
        return
    if isinstance(mask, str):
        if length > 1:
            host[..., span - length :] += _causal_tail(length)
        return
    keep = np.asarray(mask)
    if keep.ndim == 4:  # (batch, 1, length, span): add the query-group axis
        keep = keep[:, :, None]
    if keep.dtype == np.bool_:
        np.copyto(host, _NEG_INF, where=~keep)
    else:
        host += keep


@functools.lru_cache(maxsize=64)
def _causal_tail(length: int) -> np.ndarray:
    """-inf above the diagonal of the last ``length`` columns, 0 elsewhere."""
    upper = np.triu(np.ones((length, length), dtype=bool), k=1)
    return np.where(upper, _NEG_INF, np.float32(0.0))
