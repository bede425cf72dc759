"""The layers ``host_weights.install`` puts in place of a narrow model's own: MLX's linear
and embedding classes whose products (and 4-bit row lookups) run on our kernels
(``weight_structs``), so that MLX's graph runs up to their input and our product from
there. A 4-bit twin holds its words in our order, which only our C reads (its class says
so: ``WORDS_IN_OUR_ORDER``)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
from mlx import nn

from semantic.adapters.mlx.cpu.weight_structs import (
    HostWeight,
    evaluated,
    in_our_order,
    product,
    table_rows,
)


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
    """A ``QuantizedLinear`` whose products run on our kernels: all of them, as its 4-bit
    words are in our order, not MLX's (other inputs widened, the product cast back)."""

    WORDS_IN_OUR_ORDER = True

    def __init__(self, source: Any) -> None:
        nn.Module.__init__(self)  # type: ignore[attr-defined]  # mlx.nn: untyped
        _copy_quantized(source, self)
        self._adopt(source)

    def __call__(self, x: mx.array) -> mx.array:
        return product(self._host, x.astype(mx.float32), self.get("bias")).astype(x.dtype)


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
    """A ``QuantizedEmbedding`` whose row lookups and use as the output head run on our
    kernels."""

    WORDS_IN_OUR_ORDER = True

    def __init__(self, source: Any) -> None:
        nn.Module.__init__(self)  # type: ignore[attr-defined]  # mlx.nn: untyped
        _copy_quantized(source, self)
        self.num_embeddings, self.dims = source.num_embeddings, source.dims
        self.freeze()
        self._host = HostWeight.of(self)

    def __call__(self, x: mx.array) -> mx.array:
        """Rows ``x`` as float32 by our C (``table_rows``): the bits ``mx.dequantize`` gives
        with the scales and biases widened first, as a table whose scales were float32
        would give them (MLX's own lookup follows the scales' dtype, and cannot read our
        order of 4-bit words)."""
        rows = table_rows(self._host, np.asarray(evaluated(x)).reshape(-1))
        return mx.array(rows).reshape(*x.shape, self.dims)

    def as_linear(self, x: mx.array) -> mx.array:
        return product(self._host, x.astype(mx.float32), None).astype(x.dtype)


TWINS = (HostQuantizedLinear, HostQuantizedEmbedding, HostBfloat16Linear, HostBfloat16Embedding)
"""What ``install`` swaps narrow layers for."""


def twin_of(layer: Any) -> Any:
    """The twin of a quantized or bfloat16 linear or embedding."""
    if isinstance(layer, nn.QuantizedEmbedding):  # type: ignore[attr-defined]  # mlx.nn
        return HostQuantizedEmbedding(layer)
    if isinstance(layer, nn.QuantizedLinear):  # type: ignore[attr-defined]  # mlx.nn
        return HostQuantizedLinear(layer)
    if isinstance(layer, nn.Embedding):  # type: ignore[attr-defined]  # mlx.nn
        return HostBfloat16Embedding(layer)
    return HostBfloat16Linear(layer)


def _copy_quantized(source: Any, target: Any) -> None:
    target.group_size, target.bits, target.mode = source.group_size, source.bits, source.mode
    target.weight = in_our_order(source)
    target.scales, target.biases = source.scales, source.biases
