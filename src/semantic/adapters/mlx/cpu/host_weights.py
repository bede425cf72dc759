"""A narrow model (4/8-bit or bfloat16 linears and embeddings) put on our kernels at load,
or why not.

At load on the CPU (``install``), a narrow model's float16 and bfloat16 parameters (norms,
biases, a GGUF's scales) are widened to float32, exactly, so the whole model runs in
float32 as the host pass does, its KV included; then its quantized and bfloat16 linears
and embeddings become their twins (``host_twins``), whose products run on our kernels
(``weight_structs``, ADR 0031).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
from mlx import nn
from mlx.utils import tree_flatten, tree_unflatten

from semantic.adapters.mlx.cpu.host_twins import (
    TWINS,
    HostBfloat16Embedding,
    HostBfloat16Linear,
    HostQuantizedEmbedding,
    twin_of,
)
from semantic.adapters.mlx.cpu.llama_native import native_library
from semantic.adapters.mlx.cpu.weight_structs import (
    GROUP_TYPES,
    HostWeight,
    as_numpy,
    evaluated,
    is_quantized,
    plain_float32,
)

NAME = "host-quantized-products-v1"
"""Goes into the model fingerprint: these products (4/8-bit and bfloat16 alike) round as
the float32 product over the dequantized weights, not as MLX's quantized or bfloat16
matmul."""


def obstacle(layer: Any, *, widening: bool = False) -> str | None:
    """Why ``native/weights.h`` cannot read this layer's weight as it is (or, ``widening``,
    as ``install`` leaves it: a bfloat16 layer swapped for its twin); None if it
    can."""
    if isinstance(layer, HostBfloat16Linear | HostBfloat16Embedding):
        return None
    if type(layer) in (nn.Linear, nn.Embedding):  # type: ignore[attr-defined]  # mlx.nn: untyped
        return _plain_obstacle(layer.weight, widening=widening)
    if not is_quantized(layer):
        return f"{type(layer).__name__} projections: Linear or QuantizedLinear only"
    if layer.mode != "affine" or layer.bits not in (4, 8) or layer.get("biases") is None:
        return f"{layer.mode} {layer.bits}-bit quantization: affine 4- or 8-bit only"
    if layer.group_size % (32 if layer.bits == 4 else 16):
        multiple = "32 at 4 bits" if layer.bits == 4 else "16"
        return f"quantization groups of {layer.group_size}: a multiple of {multiple} only"
    if not np.asarray(evaluated(layer.weight)).flags.c_contiguous:
        return "packed weights not contiguous"
    if not _groups_as_they_are(layer):
        return f"{layer.scales.dtype} quantization scales: float32, float16 or bfloat16 only"
    return None


def _groups_as_they_are(layer: Any) -> bool:
    """Scales and biases our products read where they are: one dtype of ``GROUP_TYPES``
    for both, rows contiguous."""
    arrays = (layer.scales, layer.biases)
    one_type = arrays[0].dtype == arrays[1].dtype and arrays[0].dtype in GROUP_TYPES
    return one_type and all(as_numpy(a).flags.c_contiguous for a in arrays)


def _plain_obstacle(weight: mx.array, *, widening: bool) -> str | None:
    if weight.dtype == mx.float32:
        return None if plain_float32(weight) else "float32 weights not contiguous"
    if weight.dtype != mx.bfloat16:
        return f"{weight.dtype} weights: float32, bfloat16 or 4/8-bit only"
    rows = np.asarray(evaluated(weight.view(mx.uint16)))
    if weight.shape[-1] % 16 or not rows.flags.c_contiguous:
        return f"bfloat16 rows of {weight.shape[-1]}: contiguous multiples of 16 only"
    if not widening:
        return "bfloat16 weights and activations: our products are not installed"
    return None


def install(model: Any) -> int:
    """On the CPU, a narrow model's float16 and bfloat16 parameters widened to float32
    (but for the bfloat16 weights our products read) and its narrow layers swapped for the
    subclasses below; how many. All or none: a model with a layer our product cannot read
    is left to MLX whole, as its fingerprint says."""
    if mx.default_device() != mx.cpu or native_library() is None:
        return 0
    narrow = _narrow_layers(model)
    if not narrow or any(obstacle(m, widening=True) for _, m in narrow):
        return 0
    kept = {f"{name}.weight" for name, m in narrow if not is_quantized(m)}
    kept |= {f"{name}.{part}" for name, m in narrow if is_quantized(m) for part in _GROUPS}
    _widen(model, kept)
    waiting = dict(narrow)
    swapped = len(waiting)
    del narrow  # one layer at a time, so that a 4-bit one's words in MLX's order are
    while waiting:  # freed before the next one's are rearranged
        name, layer = waiting.popitem()
        model.update_modules(tree_unflatten([(name, twin_of(layer))]))
    return swapped


def products_obstacle(model: Any) -> str | None:
    """Why a model's narrow products do not run on our kernels; None when they all do."""
    narrow = [m for _, m in _narrow_layers(model)]
    if not narrow:
        return "no bfloat16 or 4/8-bit layers in this model"
    left = [m for m in narrow if type(m) not in TWINS]
    if not left:
        return None
    if mx.default_device() != mx.cpu:
        return "the model runs on the GPU"
    if native_library() is None:
        return "native/llama_pass.c is not loaded here (the host pass line says why)"
    blocking = (obstacle(m, widening=True) for m in left)  # what keeps install off
    as_they_are = (obstacle(m) for m in left)  # else what install would have changed
    return next(filter(None, blocking), None) or next(filter(None, as_they_are), "not installed")


def left_to_mlx(layer: Any) -> bool:
    """A 4/8-bit or bfloat16 layer ``install`` did not swap: MLX's graph computes it its
    own way, so the host pass must not read it (its decode steps would part from MLX's
    prompt chunks)."""
    return _is_narrow(layer) and type(layer) not in TWINS


def _is_narrow(layer: Any) -> bool:
    plain = (nn.Linear, nn.Embedding)  # type: ignore[attr-defined]  # mlx.nn: untyped
    return is_quantized(layer) or (isinstance(layer, plain) and layer.weight.dtype == mx.bfloat16)


def _narrow_layers(model: Any) -> list[tuple[str, Any]]:
    """Quantized layers, and linears and embeddings whose weights are bfloat16 (or are so
    already on our products)."""
    return [(name, m) for name, m in model.named_modules() if _is_narrow(m)]


def table_of(embedding: Any) -> HostWeight | None:
    """The C struct of an embedding ``install`` put on our kernels; None for any other."""
    if isinstance(embedding, HostQuantizedEmbedding | HostBfloat16Embedding):
        host: HostWeight = embedding._host  # noqa: SLF001 - the twins' own struct
        return host
    return None


_GROUPS = ("scales", "biases")
"""A quantized layer's parameters that ``install`` leaves as they are."""


def _widen(model: Any, kept: set[str]) -> None:
    """float16 and bfloat16 parameters (norms, biases) to float32: exact. ``kept``: the
    paths of the bfloat16 weights, scales and biases our products read as they are."""
    parameters: Any = tree_flatten(model.parameters())  # a list of (path, array) pairs
    narrow = [(k, v) for k, v in parameters if v.dtype in (mx.float16, mx.bfloat16)]
    wider = [(k, v.astype(mx.float32)) for k, v in narrow if k not in kept]
    if wider:
        model.update(tree_unflatten(wider))
        mx.eval([v for _, v in wider])
