"""A llama-bodied model's weights as ``native/llama_pass.c`` reads them: addresses, sizes.

The host pass (ADR 0013) reads MLX's own weight buffers in place: ``np.asarray`` of an
evaluated MLX array is its memory. This module checks that the model is one the C code
computes exactly (plain float32 linears, their biases too, RMS norms, Qwen3's per-head q/k
norms, RoPE unscaled or with Llama 3's frequencies, our attention kernel loaded) and lays
the addresses out as the C ``model_t``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from mlx import nn

from semantic.adapters.mlx.cpu import attention, host_weights
from semantic.adapters.mlx.cpu.fused_pass import fusion_obstacle
from semantic.adapters.mlx.cpu.llama_layer import LlamaLayer
from semantic.adapters.mlx.cpu.weight_structs import (
    HostWeight,
    WeightStruct,
    plain_float32,
    table_rows,
)
from semantic.adapters.mlx.lm import Llama3RoPE
from semantic.adapters.mlx.models.model_parts import MLPS

_Pointer = ctypes.c_void_p


_WEIGHTS = ("wq", "wk", "wv", "wo", "wg", "wu", "wd")
_BIASES = ("bq", "bk", "bv", "bo", "bg", "bu", "bd")


class _Layer(ctypes.Structure):
    """``layer_t``: a NULL bias or q/k norm is one the layer does not have."""

    _fields_ = [
        *((name, _Pointer) for name in ("attn_norm", "mlp_norm")),
        *((name, WeightStruct) for name in _WEIGHTS),
        *((name, _Pointer) for name in (*_BIASES, "q_norm", "k_norm")),
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
    embed: Callable[[np.ndarray], np.ndarray]
    """Token ids to their float32 embeddings, as the model's own embedding computes them."""
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
    head_dim = _head_dim(first)
    if (why := _rope_obstacle(first.rope, head_dim)) is not None:
        return why
    for layer in inner.layers:
        if (why := _layer_obstacle(layer)) is not None:
            return why
    if not plain_float32(inner.norm.weight) or _embedding_obstacle(inner.embed_tokens):
        return "embeddings or final norm not float32 (or 4/8-bit embeddings)"
    if attention.softmax_pv_ranges_address() is None:
        return "our attention kernel is not built here"
    return None


def _head_dim(attention_module: Any) -> int:
    """Qwen2's and Qwen3's attention keep no ``head_dim``: the keys' projection tells."""
    return int(attention_module.k_proj.weight.shape[0]) // int(attention_module.n_kv_heads)


def _rope_obstacle(rope: Any, head_dim: int) -> str | None:
    kind = type(rope)
    if kind is nn.RoPE:  # type: ignore[attr-defined]  # mlx.nn: untyped
        if rope.scale != 1.0:
            return f"RoPE with linear scaling {rope.scale}: unscaled or Llama 3's only"
    elif kind is not Llama3RoPE:
        return f"RoPE {kind.__name__}: nn.RoPE or Llama 3's scaled frequencies only"
    if rope.dims != head_dim or head_dim % 64:
        return f"head dim {head_dim}, RoPE over {rope.dims}: a multiple of 64, all of it"
    return None


def _inv_freq(rope: Any, head_dim: int) -> np.ndarray:
    """Each pair's angle per position, as MLX's RoPE takes it: from the base, or the
    reciprocal of the module's own periods (Llama 3's ``_freqs``), in float32."""
    if type(rope) is Llama3RoPE:
        periods = np.asarray(rope._freqs.astype(mx.float32))  # noqa: SLF001 - its frequencies
        return np.ascontiguousarray(np.float32(1.0) / periods, dtype=np.float32)
    exponents = -np.arange(0, head_dim, 2, dtype=np.float32) / head_dim
    inv_freq: np.ndarray = (rope.base**exponents).astype(np.float32)
    return inv_freq


def _weights(model: Any) -> dict[str, Any] | None:
    if obstacle(model) is not None:
        return None
    inner = model.model
    layers = inner.layers
    first = layers[0].self_attn.inner
    head_dim = _head_dim(first)
    kept: list[Any] = []
    layer_structs = []
    for layer in layers:
        norms, weights, rest = _layer_arrays(layer)
        host = [None if a is None else np.asarray(a) for a in (*norms, *rest)]
        kept += [host, weights]
        pointers = [0 if h is None else h.ctypes.data for h in host]
        layer_structs.append(_Layer(*pointers[:2], *(w.struct for w in weights), *pointers[2:]))
    return {
        "embed": _embedding_of(inner.embed_tokens),
        "dims": (
            len(layers),
            int(inner.norm.weight.shape[0]),
            first.n_heads,
            first.n_kv_heads,
            head_dim,
            int(layers[0].mlp.gate_proj.weight.shape[0]),
        ),
        "traditional": int(first.rope.traditional),
        "eps": float(layers[0].input_layernorm.eps),
        "scale": float(first.scale),
        "inv_freq": _inv_freq(first.rope, head_dim),
        "layers": layer_structs,
        "final_norm": np.asarray(inner.norm.weight),
        "softmax_pv": attention.softmax_pv_ranges_address(),
        "kept": kept,
    }


LEFT_TO_MLX = "4/8-bit or bfloat16 layers left on MLX's products (the products line says why)"


def _layer_obstacle(layer: Any) -> str | None:
    if not isinstance(layer.mlp, MLPS):  # mlx-lm's, or with the host SwiGLU (host_swiglu)
        return f"MLP {type(layer.mlp).__name__}: a llama-bodied SwiGLU MLP only"
    described = LlamaLayer(layer)
    linears = described.linears()
    if why := next(filter(None, map(host_weights.obstacle, linears)), None):
        return why
    if any(map(host_weights.left_to_mlx, linears)):
        return LEFT_TO_MLX
    norms = [*described.norms(), *described.head_norms()]
    if any(type(norm) is not nn.RMSNorm for norm in norms):  # type: ignore[attr-defined]  # mlx.nn
        return "norms other than RMSNorm"
    if any(norm.eps != norms[0].eps for norm in norms):
        return "norms with different epsilons"
    biases = [lin.bias for lin in linears if "bias" in lin]
    if not plain_float32(*(norm.weight for norm in norms), *biases):
        return "norms or biases not float32"
    return None


def _layer_arrays(
    layer: Any,
) -> tuple[list[mx.array], list[HostWeight], list[mx.array | None]]:
    """In ``layer_t``'s order: the two norms; the weights; the biases and the q/k norms."""
    described = LlamaLayer(layer)
    linears = described.linears()
    head_norms = [n.weight for n in described.head_norms()] or [None, None]
    norms = [norm.weight for norm in described.norms()]
    rest = [*(lin.bias if "bias" in lin else None for lin in linears), *head_norms]
    mx.eval([a for a in (*norms, *rest) if a is not None])
    return norms, [HostWeight.of(lin) for lin in linears], rest


def _embedding_obstacle(embedding: Any) -> str | None:
    if type(embedding) is nn.Embedding:  # type: ignore[attr-defined]  # mlx.nn ships no types
        return None if plain_float32(embedding.weight) else "embeddings not float32"
    if why := host_weights.obstacle(embedding):
        return why
    return LEFT_TO_MLX if host_weights.left_to_mlx(embedding) else None


def _embedding_of(embedding: Any) -> Callable[[np.ndarray], np.ndarray]:
    """A float32 table is indexed in place; a 4/8-bit or bfloat16 one on our products has
    its rows dequantized by our C, as its own module rounds them (its MLX graph took 0.6 ms
    a decode step for one token); any other by its own module."""
    if type(embedding) is nn.Embedding:  # type: ignore[attr-defined]  # mlx.nn ships no types
        table = np.asarray(embedding.weight)
        return lambda tokens: table[tokens]
    host = host_weights.table_of(embedding)
    if host is not None:
        return lambda tokens: table_rows(host, tokens)
    return lambda tokens: np.asarray(embedding(mx.array(tokens)))
