"""Attention with its softmax on the host, for MLX on a CPU.

MLX's CPU ``exp`` runs about 60 million values a second here; numpy's vectorised one about
1.4 billion. At long contexts the softmax over the scores dominates a forward pass (a
256-token chunk at 1,792 tokens of context spent 2.4 of its 3.4 s there), so this module
keeps the scores product on MLX (and so on our kernels or OpenBLAS) and does the rest on
the evaluated scores, in place: the scores array is fresh and owned by nobody else, so the
host writes straight into MLX's buffer. Where it could be built, ``native/softmax_pv.c``
does the masking, softmax and the product with the values in one pass per row (3x faster
than numpy's softmax plus MLX's ``p @ V`` for a few rows at a long context); otherwise
numpy does the softmax. Only the attention of llama-bodied models (``model_parts``: llama,
Llama 3, Mistral, Qwen2, Qwen3) is wrapped, only for float32 on a CPU;
everything else keeps mlx-lm's own ``scaled_dot_product_attention``. ADR 0008 has the
measurements.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import subprocess
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from mlx import nn

from semantic.adapters.mlx.cpu.native_build import NATIVE_DIR, build_library
from semantic.adapters.mlx.models.model_parts import ATTENTIONS, is_llama_bodied, not_llama_bodied

log = logging.getLogger(__name__)

KERNEL_ENV = "SEMANTIC_HOST_ATTENTION_KERNEL"
"""``0``: the numpy softmax instead of ``native/softmax_pv.c``."""

_NUMPY_NAME = "host-softmax-v1"
_KERNEL_NAME = "host-softmax-pv-v2"

_NEG_INF = np.float32(-np.inf)

QKV = tuple[mx.array, mx.array, mx.array]
"""Projected queries, keys and values, one row per token."""


def install(model: Any) -> bool:
    """Swap each llama-bodied model's attention module for one with the host softmax."""
    if _installed(model):
        return True
    if obstacle(model) is not None:
        return False
    for layer in model.model.layers:
        layer.self_attn = HostSoftmaxAttention(layer.self_attn)
    return True


def obstacle(model: Any) -> str | None:
    """Why the host softmax cannot serve this model's attention; None when it can."""
    if _installed(model):
        return None
    if mx.default_device() != mx.cpu:
        return "the model runs on a GPU"
    if not is_llama_bodied(model):
        return not_llama_bodied(model)
    kinds = {type(layer.self_attn) for layer in model.model.layers}
    if len(kinds) != 1 or not kinds <= set(ATTENTIONS):
        names = sorted(f"{k.__module__}.{k.__name__}" for k in kinds)
        return f"attention modules {names}: mlx-lm's llama, qwen2 or qwen3 Attention only"
    return None


def _installed(model: Any) -> bool:
    """Asked of any model: one whose layers name their attention otherwise (InternLM2's
    ``attention``) or have none (a hybrid's recurrent layers) is simply not installed."""
    layers = getattr(getattr(model, "model", None), "layers", None) or []
    return bool(layers) and all(
        type(getattr(layer, "self_attn", None)) is HostSoftmaxAttention for layer in layers
    )


class HostSoftmaxAttention(nn.Module):  # type: ignore[misc,name-defined]  # mlx.nn ships no types
    """mlx-lm's attention of a llama-bodied model (its projections, biases included, its
    q/k norms where it has them, its RoPE), with ``attend`` for the core."""

    def __init__(self, inner: Any) -> None:
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
        pending = self.begin(qkv, shape, mask, cache)
        mx.eval(pending.needed)
        return pending.finish()

    def begin(self, qkv: QKV, shape: tuple[int, int], mask: Any, cache: Any) -> PendingAttention:
        """Everything up to the scores, lazily: a fused pass evaluates several groups'
        scores together, one wait per layer instead of one per group."""
        return PendingAttention.start(*self.heads(qkv, shape, cache), self.inner.scale, mask)

    def heads(self, qkv: QKV, shape: tuple[int, int], cache: Any) -> QKV:
        """Queries ``(batch, heads, length, dim)`` after RoPE, and every key and value the
        cache holds once these rows are in it (lazily)."""
        a = self.inner
        (q, k, v), (batch, length) = qkv, shape
        queries, keys = (
            q.reshape(batch, length, a.n_heads, -1),
            k.reshape(batch, length, a.n_kv_heads, -1),
        )
        if "q_norm" in a:  # Qwen3: each head's queries and keys RMS-normed, before RoPE
            queries, keys = a.q_norm(queries), a.k_norm(keys)
        queries, keys = queries.transpose(0, 2, 1, 3), keys.transpose(0, 2, 1, 3)
        values = v.reshape(batch, length, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
        offset = cache.offset if cache is not None else 0
        queries = a.rope(queries, offset=offset)
        keys = a.rope(keys, offset=offset)
        if cache is not None:
            keys, values = cache.update_and_fetch(keys, values)
        return queries, keys, values


def kernel_name() -> str:
    """Goes into the model fingerprint: KV computed by different attention code is not mixed."""
    return _KERNEL_NAME if _softmax_pv() is not None else _NUMPY_NAME


@dataclass(frozen=True, slots=True)
class PendingAttention:
    """Scaled dot-product attention with grouped KV heads, up to its scores (lazy);
    ``finish`` once ``needed`` is evaluated, for ``(batch, length, heads * head_dim)``.
    ``mask`` as mlx-lm passes it: None, ``"causal"``, or a boolean array (True = attend)
    broadcastable to the scores."""

    needed: list[mx.array]
    scores: mx.array | None
    values: mx.array
    mask: Any
    shape: tuple[int, int, int, int, int]  # batch, query heads, length, head dim, kv heads

    @classmethod
    def start(
        cls, queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask: Any
    ) -> PendingAttention:
        batch, q_heads, length, dim = queries.shape
        kv_heads = keys.shape[1]
        shape = (batch, q_heads, length, dim, kv_heads)
        if queries.dtype != mx.float32:  # no host path: MLX's own attention, done lazily
            out = mx.fast.scaled_dot_product_attention(
                queries, keys, values, scale=scale, mask=mask
            )
            return cls([out], None, out, mask, shape)
        grouped = (queries * scale).reshape(batch, kv_heads, q_heads // kv_heads * length, dim)
        scores = grouped @ keys.swapaxes(-1, -2)
        return cls([scores, values], scores, values, mask, shape)

    def finish(self) -> mx.array:
        batch, length = self.shape[0], self.shape[2]
        out = self.values if self.scores is None else self._host_softmax_pv()
        return out.transpose(0, 2, 1, 3).reshape(batch, length, -1)

    def _host_softmax_pv(self) -> mx.array:
        batch, q_heads, length, dim, kv_heads = self.shape
        scores, values, group = self.scores, self.values, q_heads // kv_heads
        assert scores is not None  # only called for the host path
        span = scores.shape[-1]
        kernel = _softmax_pv()
        ranges = _key_ranges(self.mask, batch, length, span) if kernel is not None else None
        if kernel is None or ranges is None or dim % 64 or values.dtype != mx.float32:
            _softmax_in_place(np.asarray(scores), self.mask, group, length, span)
            return (scores @ values).reshape(batch, q_heads, length, dim)
        host_values = np.asarray(values)
        lo, hi = ranges
        out = np.empty((batch, kv_heads, group * length, dim), dtype=np.float32)
        v_batch, v_head, v_row, _ = (stride // 4 for stride in host_values.strides)
        kernel(
            *(batch, kv_heads, group * length, span, dim),
            np.asarray(scores).ctypes.data,
            host_values.ctypes.data,
            *(v_batch, v_head, v_row),
            lo.ctypes.data,
            hi.ctypes.data,
            length,
            out.ctypes.data,
        )
        return mx.array(out).reshape(batch, q_heads, length, dim)


def _softmax_in_place(scores: np.ndarray, mask: Any, group: int, length: int, span: int) -> None:
    host = scores.reshape(scores.shape[0], scores.shape[1], group, length, span)
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


def _key_ranges(
    mask: Any, batch: int, length: int, span: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """Each (sequence, query position)'s attended keys as one range [lo, hi); None if the
    mask is not of that form (an additive mask, say). Every layer of a pass gets the same
    mask object: its ranges are worked out once."""
    if mask is None or isinstance(mask, str):
        return _plain_ranges(mask, batch, length, span)
    last = _last_ranges
    if last and last[0] is mask and last[1] == (batch, length, span):
        cached: tuple[np.ndarray, np.ndarray] | None = last[2]
        return cached
    ranges = _array_ranges(mask, batch, length, span)
    _last_ranges[:] = [mask, (batch, length, span), ranges]  # holds the mask: its id stays its
    return ranges


_last_ranges: list[Any] = []


def _plain_ranges(
    mask: str | None, batch: int, length: int, span: int
) -> tuple[np.ndarray, np.ndarray] | None:
    lo = np.zeros((batch, length), dtype=np.int32)
    if mask is None:
        return lo, np.full((batch, length), span, dtype=np.int32)
    if mask != "causal":
        return None
    hi = np.arange(span - length + 1, span + 1, dtype=np.int32)
    return lo, np.broadcast_to(hi, (batch, length)).copy()


def _array_ranges(
    mask: Any, batch: int, length: int, span: int
) -> tuple[np.ndarray, np.ndarray] | None:
    keep = np.asarray(mask)
    if keep.dtype != np.bool_ or keep.ndim != 4 or keep.shape[1] != 1:
        return None
    keep = np.broadcast_to(keep[:, 0], (batch, length, span))
    any_key = keep.any(axis=-1)
    lo = np.where(any_key, keep.argmax(axis=-1), 0).astype(np.int32)
    hi = np.where(any_key, span - keep[..., ::-1].argmax(axis=-1), 0).astype(np.int32)
    if not np.array_equal(keep.sum(axis=-1), hi - lo):
        return None
    return lo, hi


def softmax_pv_ranges_address() -> int | None:
    """Where ``semantic_softmax_pv_ranges`` is loaded, for other C code to call (host_pass)."""
    library = _kernel_library()
    if library is None:
        return None
    return ctypes.cast(library.semantic_softmax_pv_ranges, ctypes.c_void_p).value


@functools.cache
def _kernel_library() -> ctypes.CDLL | None:
    """``native/softmax_pv.c``, loaded; None without a compiler, or when turned off."""
    if os.environ.get(KERNEL_ENV) == "0":
        return None
    try:
        library = build_library(NATIVE_DIR / "softmax_pv.c", "libsemantic_softmax_pv")
        return None if library is None else ctypes.CDLL(str(library))
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("host attention kernel unavailable (%s); using numpy's softmax", error)
        return None


@functools.cache
def _softmax_pv() -> Any:
    """The loaded ``semantic_softmax_pv`` function, or None."""
    library = _kernel_library()
    if library is None:
        return None
    function = library.semantic_softmax_pv
    pointer, size = ctypes.c_void_p, ctypes.c_long
    function.argtypes = [ctypes.c_int] * 5 + [pointer, pointer, size, size, size]
    function.argtypes += [pointer, pointer, ctypes.c_int, pointer]
    function.restype = None
    return function


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
