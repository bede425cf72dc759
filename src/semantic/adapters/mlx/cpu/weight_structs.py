"""Weight matrices as ``native/weights.h`` reads them, and the two calls into it: a product
of activation rows by a matrix, and rows of an embedding table.

MLX's CPU quantized matmul reads about a nanosecond per weight here: 25 ms for SmolLM2's
8-bit output head for one row, 200 ms for eight; its bfloat16 matmul runs 5-6 GFLOP/s,
a twentieth of OpenBLAS's float32 (ADR 0031). Our product reads packed 4- and 8-bit words
and bfloat16 halves in place and multiplies them on the small-product kernel, so a 4-bit
model moves an eighth of the bytes of its float32 copy, a bfloat16 one half, and each
computes the same bits as that copy. 4-bit words are read in our order (``in_our_order``),
not MLX's.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from mlx import nn

from semantic.adapters.mlx.cpu.llama_native import native_library

_Pointer = ctypes.c_void_p

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


GROUP_TYPES = {mx.float32: 0, mx.float16: 1, mx.bfloat16: 2}
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
        linear or embedding (``host_weights.obstacle`` says None). A 4-bit layer's words
        are rearranged into a copy the struct keeps, unless its class says they are in our
        order already (``WORDS_IN_OUR_ORDER``: the twins)."""
        if not is_quantized(layer):
            kind = BF16 if layer.weight.dtype == mx.bfloat16 else FLOAT32
            # numpy has no bfloat16: the same bytes as uint16, in place
            in_place = layer.weight.view(mx.uint16) if kind == BF16 else layer.weight
            weight = np.asarray(evaluated(in_place))
            out_dims, in_dims = weight.shape
            struct = WeightStruct(weight.ctypes.data, None, None, kind, 0)
            return cls(struct, in_dims, out_dims, (weight,))
        ours = getattr(type(layer), "WORDS_IN_OUR_ORDER", False)
        words = layer.weight if ours else in_our_order(layer)
        weight = np.asarray(evaluated(words))
        scales, biases = (as_numpy(a) for a in (layer.scales, layer.biases))
        group_type = GROUP_TYPES[layer.scales.dtype]
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


def in_our_order(layer: Any) -> mx.array:
    """An MLX quantized layer's words as ``native/quantized.h`` reads them: 8-bit as they
    are; 4-bit rearranged so that in every 32 inputs byte j holds input j in its low nibble
    and input j + 16 in its high one (MLX's byte j holds inputs 2j and 2j + 1), which
    our kernels widen into two vectors of weights without a shuffle (ADR 0031). The same
    bytes, so the same memory; a new array, the layer's own left as it was."""
    if layer.bits != Q4:
        return layer.weight  # type: ignore[no-any-return]  # mlx.nn: untyped
    words = np.asarray(evaluated(layer.weight))
    blocks = words.view(np.uint8).reshape(-1, 16)  # a row's inputs are a multiple of 32
    inputs = np.empty((blocks.shape[0], 32), np.uint8)
    inputs[:, 0::2], inputs[:, 1::2] = blocks & 15, blocks >> 4
    paired = inputs[:, :16] | (inputs[:, 16:] << 4)
    return mx.array(paired.reshape(-1).view(np.uint32).reshape(words.shape))


def product(weight: HostWeight, x: mx.array, bias: mx.array | None) -> mx.array:
    """``x @ W^T (+ bias)`` over the last axis of ``x``, evaluated now."""
    rows = x.size // weight.in_dims
    flat = np.ascontiguousarray(np.asarray(evaluated(x)).reshape(rows, weight.in_dims))
    out = np.empty((rows, weight.out_dims), np.float32)
    held = None if bias is None else np.ascontiguousarray(np.asarray(evaluated(bias)))
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


def is_quantized(layer: Any) -> bool:
    kinds = (nn.QuantizedLinear, nn.QuantizedEmbedding)  # type: ignore[attr-defined]  # mlx.nn
    return isinstance(layer, kinds)


def as_numpy(array: mx.array) -> np.ndarray:
    """``array``'s memory as numpy sees it: bfloat16 (which numpy lacks) as its uint16 bits."""
    in_place = array.view(mx.uint16) if array.dtype == mx.bfloat16 else array
    return np.asarray(evaluated(in_place))


def evaluated(array: mx.array) -> mx.array:
    mx.eval(array)
    return array


def plain_float32(*arrays: Any) -> bool:
    """Arrays the C code reads as they are: MLX float32, rows contiguous."""
    return all(
        isinstance(a, mx.array) and a.dtype == mx.float32 and np.asarray(a).flags.c_contiguous
        for a in arrays
    )
