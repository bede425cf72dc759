"""A llama model's weights as ``native/llama_pass.c`` reads them: addresses and sizes.

The host pass (ADR 0013) reads MLX's own weight buffers in place: ``np.asarray`` of an
evaluated MLX array is its memory. This module checks that the model is one the C code
computes exactly (plain float32 linears without bias, RMS norms, RoPE without scaling,
our attention kernel loaded) and lays the addresses out as the C ``model_t``.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from mlx import nn

from semantic.adapters.mlx import attention
from semantic.adapters.mlx.fused_pass import fusion_obstacle

_Pointer = ctypes.c_void_p


class _Layer(ctypes.Structure):
    _fields_ = [
        (name, _Pointer)
        for name in ("attn_norm", "mlp_norm", "wq", "wk", "wv", "wo", "wg", "wu", "wd")
    ]


class ModelStruct(ctypes.Structure):
    """``model_t`` of ``native/llama_pass.c``."""

    _fields_ = [
        *((name, ctypes.c_int) for name in ("layers", "hidden", "heads", "kv_heads")),
        ("head_dim", ctypes.c_int),
        ("inter", ctypes.c_int),
        ("traditional", ctypes.c_int),
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("inv_freq", _Pointer),
        ("layer", ctypes.POINTER(_Layer)),
        ("final_norm", _Pointer),
        ("softmax_pv", _Pointer),
    ]


@dataclass(frozen=True, slots=True)
class HostModel:
    """The C struct for one model, and the arrays whose memory it points into."""

    struct: ModelStruct
    embed: np.ndarray
    kv_heads: int
    head_dim: int
    hidden: int
    kept: list[Any]

    @classmethod
    def of(cls, model: Any) -> HostModel | None:
        """None unless every weight is one the C code reads as it is."""
        weights = _weights(model)
        if weights is None:
            return None
        layers = (_Layer * len(weights["layers"]))(*weights["layers"])
        dims = weights["dims"]
        struct = ModelStruct(
            *dims,
            weights["traditional"],
            weights["eps"],
            weights["scale"],
            weights["inv_freq"].ctypes.data,
            layers,
            weights["final_norm"].ctypes.data,
            weights["softmax_pv"],
        )
        kept = [weights, layers]
        return cls(struct, weights["embed"], int(dims[3]), int(dims[4]), int(dims[1]), kept)


def obstacle(model: Any) -> str | None:
    """Why the C pass cannot compute this model exactly; None when it can."""
    if (why := fusion_obstacle(model)) is not None:
        return why
    inner = model.model
    first = inner.layers[0].self_attn.inner
    rope = first.rope
    if type(rope) is not nn.RoPE or rope.scale != 1.0:  # type: ignore[attr-defined]  # mlx.nn: untyped
        return f"RoPE {type(rope).__name__} (scale {getattr(rope, 'scale', '?')}): plain RoPE only"
    if rope.dims != first.head_dim or first.head_dim % 64:
        return f"head dim {first.head_dim}, RoPE over {rope.dims}: a multiple of 64, all of it"
    for layer in inner.layers:
        if (why := _layer_obstacle(layer)) is not None:
            return why
    if not _plain_float32(getattr(inner.embed_tokens, "weight", None), inner.norm.weight):
        return "embeddings or final norm not plain float32"
    if attention.softmax_pv_ranges_address() is None:
        return "our attention kernel is not built here"
    return None


def _weights(model: Any) -> dict[str, Any] | None:
    if obstacle(model) is not None:
        return None
    inner = model.model
    layers = inner.layers
    first = layers[0].self_attn.inner
    rope = first.rope
    parts = [_layer_arrays(layer) for layer in layers]
    embed: Any = inner.embed_tokens.weight
    head_dim = rope.dims
    inv_freq = (rope.base ** (-np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)).astype(
        np.float32
    )
    kernel = attention.softmax_pv_ranges_address()
    arrays = [a for p in parts for a in p]
    kept = [np.asarray(a) for a in arrays]
    layer_structs = [
        _Layer(*(k.ctypes.data for k in kept[i * 9 : i * 9 + 9])) for i in range(len(layers))
    ]
    mlp = layers[0].mlp
    return {
        "embed": np.asarray(embed),
        "dims": (
            len(layers),
            int(embed.shape[1]),
            first.n_heads,
            first.n_kv_heads,
            head_dim,
            int(mlp.gate_proj.weight.shape[0]),
        ),
        "traditional": int(rope.traditional),
        "eps": float(layers[0].input_layernorm.eps),
        "scale": float(first.scale),
        "inv_freq": inv_freq,
        "layers": layer_structs,
        "final_norm": np.asarray(inner.norm.weight),
        "softmax_pv": kernel,
        "kept": kept,
    }


def _linears(layer: Any) -> list[Any]:
    a, mlp = layer.self_attn.inner, layer.mlp
    return [a.q_proj, a.k_proj, a.v_proj, a.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]


def _layer_obstacle(layer: Any) -> str | None:
    linears = _linears(layer)
    plain = nn.Linear  # type: ignore[attr-defined]  # mlx.nn ships no types
    if kinds := {type(lin).__name__ for lin in linears if type(lin) is not plain}:
        return f"{', '.join(sorted(kinds))} projections (quantized?): plain float32 Linear only"
    if any("bias" in lin for lin in linears):
        return "projections with biases"
    norms = [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
    if not _plain_float32(*norms, *(lin.weight for lin in linears)):
        return f"{linears[0].weight.dtype} weights: float32 only"
    return None


def _layer_arrays(layer: Any) -> list[mx.array]:
    norms = [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
    arrays = [*norms, *(lin.weight for lin in _linears(layer))]
    mx.eval(arrays)
    return arrays


def _plain_float32(*arrays: Any) -> bool:
    return all(
        isinstance(a, mx.array) and a.dtype == mx.float32 and np.asarray(a).flags.c_contiguous
        for a in arrays
    )
