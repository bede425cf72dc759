"""MLX KV payloads to host arrays and back, without extra copies.

Writing: an evaluated MLX array on the CPU exposes its memory to numpy, so the block file is
written straight from the KV buffers. Reading: ``mx.empty`` buffers are handed to the file
reader as numpy views and filled in place; nothing else holds them yet, so MLX sees the data
as if it had computed it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import mlx.core as mx
import numpy as np

from semantic.adapters.mlx.kv_blocks import MlxKV
from semantic.adapters.storage.block_files import TensorSpan
from semantic.domain.blocks import KVBlock
from semantic.domain.errors import CacheCorruptionError
from semantic.ports.block_store import LayerPayload

FORMAT = "semantic-kv-1"
_BITS_AS = {mx.bfloat16: mx.uint16}  # numpy has no bfloat16: store its bits
_BY_NAME = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


class MlxHostCodec:
    def to_host(self, blocks: Sequence[KVBlock]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        tensors: dict[str, np.ndarray] = {}
        layers: list[str] = []
        dtype = ""
        for block in blocks:
            kv = block.payload
            if not isinstance(kv, MlxKV):
                raise TypeError(f"cannot store a {type(kv).__name__} payload")
            dtype = _name(kv.keys.dtype)
            tensors[f"{block.layer}.keys"] = _host_view(kv.keys)
            tensors[f"{block.layer}.values"] = _host_view(kv.values)
            layers.append(f"{block.layer}:{block.start}:{block.n_tokens}")
        return tensors, {"format": FORMAT, "dtype": dtype, "layers": ",".join(layers)}

    def reader(self) -> MlxHostReader:
        return MlxHostReader()


class MlxHostReader:
    """Reads a block file into one MLX buffer; each tensor is a view into it (no copy)."""

    def __init__(self) -> None:
        self._buffer: mx.array | None = None

    def allocate(self, n_bytes: int) -> np.ndarray:
        self._buffer = mx.empty((n_bytes,), dtype=mx.uint8)
        mx.eval(self._buffer)
        view: np.ndarray = np.asarray(self._buffer)
        return view

    def finish(
        self, spans: Mapping[str, TensorSpan], metadata: Mapping[str, str]
    ) -> list[LayerPayload]:
        if metadata.get("format") != FORMAT or self._buffer is None:
            raise CacheCorruptionError(f"unknown block format {metadata.get('format')!r}")
        dtype = _BY_NAME[metadata["dtype"]]
        out = []
        for entry in metadata["layers"].split(","):
            layer, start, n_tokens = (int(part) for part in entry.split(":"))
            keys = self._tensor(spans[f"{layer}.keys"], dtype)
            values = self._tensor(spans[f"{layer}.values"], dtype)
            out.append(LayerPayload(layer, start, n_tokens, MlxKV(keys, values)))
        # Evaluate the views here: a lazy op belongs to this thread's stream, and the
        # engine thread could not run it. Views of one buffer, so nothing is copied.
        mx.eval([(p.data.keys, p.data.values) for p in out if isinstance(p.data, MlxKV)])
        return out

    def _tensor(self, span: TensorSpan, dtype: mx.Dtype) -> mx.array:
        if self._buffer is None:
            raise CacheCorruptionError("block data was never read")
        raw = self._buffer[span.begin : span.end].view(dtype)
        return raw.reshape(1, *span.shape)


def _name(dtype: mx.Dtype) -> str:
    return next(name for name, value in _BY_NAME.items() if value == dtype)


def _host_view(array: mx.array) -> np.ndarray:
    stored = array.view(_BITS_AS[array.dtype]) if array.dtype in _BITS_AS else array
    mx.eval(stored)
    view: np.ndarray = np.asarray(stored)[0]
    return view
