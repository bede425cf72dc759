"""Weight matrices as ``native/weights.h`` reads them, and narrow layers computed there.

MLX's CPU quantized matmul reads about a nanosecond per weight here: 25 ms for SmolLM2's
8-bit output head for one row, 200 ms for eight; its bfloat16 matmul runs 5-6 GFLOP/s,
a twentieth of OpenBLAS's float32 (ADR 0031). Our product reads packed 4- and 8-bit words
and bfloat16 halves in place and multiplies them on the small-product kernel, so a 4-bit
model moves an eighth of the bytes of its float32 copy, a bfloat16 one half, and each
computes the same bits as that copy.
At load on the CPU (``install``), a narrow model's float16 and bfloat16 parameters (norms,
biases, a GGUF's scales) are widened to float32, exactly, so the whole model runs in
float32 as the host pass does, its KV included; then its quantized and bfloat16 linears
and embeddings become the subclasses below, which run MLX's graph up to their input and
our product from there.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from mlx import nn
from mlx.utils import tree_flatten, tree_unflatten

from semantic.adapters.mlx.cpu.llama_native import native_library

_Pointer = ctypes.c_void_p

NAME = "host-quantized-products-v1"
"""Goes into the model fingerprint: these products (4/8-bit and bfloat16 alike) round as
the float32 product over the dequantized weights, not as MLX's quantized or bfloat16
matmul."""

FLOAT32, Q8, Q4, BF16 = 0, 8, 4, 16
"""``weight_t.kind``: the narrow kinds are their bit widths."""


class WeightStruct(ctypes.Structure):
    """``weight_t`` of ``native/weights.h``."""

    _fields_ = [
        ("data", _Pointer),
        ("scales", _Pointer),
        ("biases", _Pointer),
        ("kind", ctypes.c_int),
        ("group", ctypes.c_int),
        ("group_type", ctypes.c_int),
    ]


_GROUP_TYPES = {mx.float32: 0, mx.float16: 1, mx.bfloat16: 2}
"""``weight_t.group_type``: the dtypes a quantized matrix's scales and biases are read in, as
the model file keeps them (each widened to float32 exactly as it is read)."""


@dataclass(frozen=True, slots=True)
class HostWeight:
    """The C struct of one weight matrix, and the arrays whose memory it points into."""

    struct: WeightStruct
    in_dims: int
    out_dims: int
    kept: tuple[np.ndarray, ...]

    @classmethod
    def of(cls, layer: Any) -> HostWeight:
        """A float32 or bfloat16 ``Linear`` or ``Embedding``, or an affine 4/8-bit quantized
        linear or embedding (``obstacle`` says None)."""
        if not _is_quantized(layer):
            kind = BF16 if layer.weight.dtype == mx.bfloat16 else FLOAT32
            # numpy has no bfloat16: the same bytes as uint16, in place
            in_place = layer.weight.view(mx.uint16) if kind == BF16 else layer.weight
            weight = np.asarray(_evaluated(in_place))
            out_dims, in_dims = weight.shape
            struct = WeightStruct(weight.ctypes.data, None, None, kind, 0)
            return cls(struct, in_dims, out_dims, (weight,))
        weight = np.asarray(_evaluated(layer.weight))
        scales, biases = (_as_numpy(a) for a in (layer.scales, layer.biases))
        group_type = _GROUP_TYPES[layer.scales.dtype]
        struct = WeightStruct(
            weight.ctypes.data,
            scales.ctypes.data,
            biases.ctypes.data,
            layer.bits,
            layer.group_size,
            group_type,
        )
        in_dims = weight.shape[1] * 32 // layer.bits
        return cls(struct, in_dims, weight.shape[0], (weight, scales, biases))


def obstacle(layer: Any, *, widening: bool = False) -> str | None:
    """Why ``native/weights.h`` cannot read this layer's weight as it is (or, ``widening``,
    as ``install`` leaves it: a bfloat16 layer swapped for its twin below); None if it
    can."""
    if isinstance(layer, HostBfloat16Linear | HostBfloat16Embedding):
        return None
    if type(layer) in (nn.Linear, nn.Embedding):  # type: ignore[attr-defined]  # mlx.nn: untyped
        return _plain_obstacle(layer.weight, widening=widening)
    if not _is_quantized(layer):
        return f"{type(layer).__name__} projections: Linear or QuantizedLinear only"
    if layer.mode != "affine" or layer.bits not in (4, 8) or layer.get("biases") is None:
        return f"{layer.mode} {layer.bits}-bit quantization: affine 4- or 8-bit only"
    if layer.group_size % 16:
        return f"quantization groups of {layer.group_size}: a multiple of 16 only"
    if not np.asarray(_evaluated(layer.weight)).flags.c_contiguous:
        return "packed weights not contiguous"
    if not _groups_as_they_are(layer):
        return f"{layer.scales.dtype} quantization scales: float32, float16 or bfloat16 only"
    return None


def _groups_as_they_are(layer: Any) -> bool:
    """Scales and biases our products read where they are: one dtype of ``_GROUP_TYPES``
    for both, rows contiguous."""
    arrays = (layer.scales, layer.biases)
    one_type = arrays[0].dtype == arrays[1].dtype and arrays[0].dtype in _GROUP_TYPES
    return one_type and all(_as_numpy(a).flags.c_contiguous for a in arrays)


def _as_numpy(array: mx.array) -> np.ndarray:
    """``array``'s memory as numpy sees it: bfloat16 (which numpy lacks) as its uint16 bits."""
    in_place = array.view(mx.uint16) if array.dtype == mx.bfloat16 else array
    return np.asarray(_evaluated(in_place))


def _plain_obstacle(weight: mx.array, *, widening: bool) -> str | None:
    if weight.dtype == mx.float32:
        return None if plain_float32(weight) else "float32 weights not contiguous"
    if weight.dtype != mx.bfloat16:
        return f"{weight.dtype} weights: float32, bfloat16 or 4/8-bit only"
    rows = np.asarray(_evaluated(weight.view(mx.uint16)))
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
    kept = {f"{name}.weight" for name, m in narrow if not _is_quantized(m)}
    kept |= {f"{name}.{part}" for name, m in narrow if _is_quantized(m) for part in _GROUPS}
    _widen(model, kept)
    swapped = [(name, _host_twin(m)) for name, m in narrow]
    model.update_modules(tree_unflatten(swapped))
    return len(swapped)


def products_obstacle(model: Any) -> str | None:
    """Why a model's narrow products do not run on our kernels; None when they all do."""
    narrow = [m for _, m in _narrow_layers(model)]
    if not narrow:
        return "no bfloat16 or 4/8-bit layers in this model"
    left = [m for m in narrow if type(m) not in _TWINS]
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
    return _is_narrow(layer) and type(layer) not in _TWINS


def _is_narrow(layer: Any) -> bool:
    plain = (nn.Linear, nn.Embedding)  # type: ignore[attr-defined]  # mlx.nn: untyped
    return _is_quantized(layer) or (isinstance(layer, plain) and layer.weight.dtype == mx.bfloat16)


def _narrow_layers(model: Any) -> list[tuple[str, Any]]:
    """Quantized layers, and linears and embeddings whose weights are bfloat16 (or are so
    already on our products)."""
    return [(name, m) for name, m in model.named_modules() if _is_narrow(m)]


class _OnOurProducts:
    """Mixed in before an MLX linear: its float32 products run on our kernels; any other
    input keeps the MLX layer's own matmul."""

    def _adopt(self: Any, source: Any) -> None:
        """``source``'s weights (and bias), frozen, and the C struct our products read."""
        if "bias" in source:
            self.bias = source.bias
        self.freeze()
        self._host = HostWeight.of(self)

    def __call__(self: Any, x: mx.array) -> mx.array:
        if x.dtype != mx.float32:
            return super().__call__(x)  # type: ignore[misc, no-any-return]  # the MLX layer next in the MRO
        return product(self._host, x, self.get("bias"))


class HostQuantizedLinear(_OnOurProducts, nn.QuantizedLinear):  # type: ignore[misc, name-defined]  # mlx.nn: untyped
    """A ``QuantizedLinear`` whose float32 products run on our kernels."""

    def __init__(self, source: Any) -> None:
        nn.Module.__init__(self)  # type: ignore[attr-defined]  # mlx.nn: untyped
        _copy_quantized(source, self)
        self._adopt(source)


class HostBfloat16Linear(_OnOurProducts, nn.Linear):  # type: ignore[misc, name-defined]  # mlx.nn: untyped
    """A bfloat16 ``Linear`` whose float32 products run on our kernels."""

    def __init__(self, source: Any) -> None:
        nn.Module.__init__(self)  # type: ignore[attr-defined]  # mlx.nn: untyped
        self.weight = source.weight
        self._adopt(source)


class HostBfloat16Embedding(nn.Embedding):  # type: ignore[misc, name-defined]  # mlx.nn: untyped
    """A bfloat16 ``Embedding`` whose rows come out float32 (exactly) and whose use as the
    output head runs on our kernels."""

    def __init__(self, source: Any) -> None:
        nn.Module.__init__(self)  # type: ignore[attr-defined]  # mlx.nn: untyped
        self.weight = source.weight
        self.freeze()
        self._host = HostWeight.of(self)

    def __call__(self, x: mx.array) -> mx.array:
        return super().__call__(x).astype(mx.float32)  # type: ignore[no-any-return]  # mlx.nn

    def as_linear(self, x: mx.array) -> mx.array:
        if x.dtype != mx.float32:
            return super().as_linear(x)  # type: ignore[no-any-return]  # mlx.nn: untyped
        return product(self._host, x, None)


class HostQuantizedEmbedding(nn.QuantizedEmbedding):  # type: ignore[misc, name-defined]  # mlx.nn
    """A ``QuantizedEmbedding`` whose use as the output head runs on our kernels."""

    def __init__(self, source: Any) -> None:
        nn.Module.__init__(self)  # type: ignore[attr-defined]  # mlx.nn: untyped
        _copy_quantized(source, self)
        self.num_embeddings, self.dims = source.num_embeddings, source.dims
        self.freeze()
        self._host = HostWeight.of(self)

    def __call__(self, x: mx.array) -> mx.array:
        """Rows ``x`` as float32, their scales and biases widened first (exact), as a table
        whose scales were float32 would give them (MLX's own lookup follows the scales'
        dtype)."""
        scales, biases = (a[x].astype(mx.float32) for a in (self.scales, self.biases))
        return mx.dequantize(
            self.weight[x], scales, biases, group_size=self.group_size, bits=self.bits
        )

    def as_linear(self, x: mx.array) -> mx.array:
        if x.dtype != mx.float32:
            return super().as_linear(x)  # type: ignore[no-any-return]  # mlx.nn: untyped
        return product(self._host, x, None)


_TWINS = (HostQuantizedLinear, HostQuantizedEmbedding, HostBfloat16Linear, HostBfloat16Embedding)
"""What ``install`` swaps narrow layers for."""


def product(weight: HostWeight, x: mx.array, bias: mx.array | None) -> mx.array:
    """``x @ W^T (+ bias)`` over the last axis of ``x``, evaluated now."""
    rows = x.size // weight.in_dims
    flat = np.ascontiguousarray(np.asarray(_evaluated(x)).reshape(rows, weight.in_dims))
    out = np.empty((rows, weight.out_dims), np.float32)
    held = None if bias is None else np.ascontiguousarray(np.asarray(_evaluated(bias)))
    if rows:
        status = _native("semantic_weight_product")(
            ctypes.byref(weight.struct),
            flat.ctypes.data,
            None if held is None else held.ctypes.data,
            out.ctypes.data,
            rows,
            weight.in_dims,
            weight.out_dims,
        )
        if status != 0:
            raise MemoryError("the weight product could not allocate its scratch memory")
    return mx.array(out).reshape(*x.shape[:-1], weight.out_dims)


def table_of(embedding: Any) -> HostWeight | None:
    """The C struct of an embedding ``install`` put on our kernels; None for any other."""
    if isinstance(embedding, HostQuantizedEmbedding | HostBfloat16Embedding):
        host: HostWeight = embedding._host  # noqa: SLF001 - this module's own twins
        return host
    return None


def table_rows(weight: HostWeight, ids: np.ndarray) -> np.ndarray:
    """Rows ``ids`` of a 4/8-bit or bfloat16 embedding table as float32, the bits its own
    module computes (``dequantize_row`` rounds as ``mx.dequantize``), without a trip through
    MLX's graph for a pass's few tokens. An id past the table raises, as numpy's indexing
    of a float32 table does, where the C would read past it."""
    wanted = np.ascontiguousarray(ids, dtype=np.int64)
    if wanted.size and not (wanted.min() >= 0 and wanted.max() < weight.out_dims):
        raise IndexError(f"token ids outside the table's {weight.out_dims} rows")
    out = np.empty((wanted.size, weight.in_dims), np.float32)
    _native("semantic_dequantize_rows")(
        ctypes.byref(weight.struct),
        wanted.ctypes.data,
        wanted.size,
        weight.in_dims,
        out.ctypes.data,
    )
    return out


_SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "semantic_weight_product": ([_Pointer] * 4 + [ctypes.c_int] * 3, ctypes.c_int),
    "semantic_dequantize_rows": ([_Pointer, _Pointer, ctypes.c_int, ctypes.c_int, _Pointer], None),
}
"""Argument and result types of the functions of native/llama_pass.c this module calls."""


@functools.cache
def _native(name: str) -> Any:
    found = native_library()
    if found is None:
        raise RuntimeError("native/llama_pass.c is not built here")
    function = getattr(found, name)
    function.argtypes, function.restype = _SIGNATURES[name]
    return function


def _host_twin(layer: Any) -> Any:
    if isinstance(layer, nn.QuantizedEmbedding):  # type: ignore[attr-defined]  # mlx.nn
        return HostQuantizedEmbedding(layer)
    if isinstance(layer, nn.QuantizedLinear):  # type: ignore[attr-defined]  # mlx.nn
        return HostQuantizedLinear(layer)
    if isinstance(layer, nn.Embedding):  # type: ignore[attr-defined]  # mlx.nn
        return HostBfloat16Embedding(layer)
    return HostBfloat16Linear(layer)


def _copy_quantized(source: Any, target: Any) -> None:
    target.group_size, target.bits, target.mode = source.group_size, source.bits, source.mode
    target.weight, target.scales, target.biases = source.weight, source.scales, source.biases


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


def _is_quantized(layer: Any) -> bool:
    kinds = (nn.QuantizedLinear, nn.QuantizedEmbedding)  # type: ignore[attr-defined]  # mlx.nn
    return isinstance(layer, kinds)


def _evaluated(array: mx.array) -> mx.array:
    mx.eval(array)
    return array


def plain_float32(*arrays: Any) -> bool:
    """Arrays the C code reads as they are: MLX float32, rows contiguous."""
    return all(
        isinstance(a, mx.array) and a.dtype == mx.float32 and np.asarray(a).flags.c_contiguous
        for a in arrays
    )
