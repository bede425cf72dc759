"""MLX KV payloads to host arrays and back, without extra copies.

Writing: an evaluated MLX array on the CPU exposes its memory to numpy, so the block file is
written straight from the KV buffers. Reading: an MLX buffer (recycled from an earlier
restore where one fits, see ``restore_buffers``) is handed to the file reader as a numpy view
and filled in place; nothing else holds it yet, so MLX sees the data as if it had computed
it. The tensors are views into that one buffer, made by one ``split``.

At rest the KV may be kept 8- or 4-bit (``mx.quantize``, groups of 64 along the head
dimension, or 32 where a head's size is no multiple of 64 (Phi-3's 96), a float32 scale
and bias per group; the reader infers the group from the shapes): lossy, so it is opt-in,
and the mode is part of the storage format and so of the model fingerprint (blocks written
one way are never read as the other). Memory (the hot tier) always holds the exact KV.

Where the device's memory is not host-addressable (``devices.HostMemory``: CUDA), nothing
here views an MLX array: a file is read into host memory and becomes an MLX array of its
own (one copy to the device), and a block is written from host copies of its tensors.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence

import mlx.core as mx
import numpy as np

from semantic.adapters.mlx.devices import HOST_VIEWS, HostMemory
from semantic.adapters.mlx.errors import UnsupportedModelError
from semantic.adapters.mlx.kv.kv_payloads import ALL, MlxKV, StackedKV, host_rows, kv_arrays
from semantic.adapters.mlx.kv.restore_buffers import RestoreBuffers
from semantic.adapters.storage.safetensors_layout import TensorSpan
from semantic.domain.blocks import KVBlock
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.errors import CacheCorruptionError
from semantic.ports.block_store import LayerPayload

FORMAT = "semantic-kv-1"
AT_REST_BITS = {"lossless": None, "q8": 8, "q4": 4}
_GROUPS = (64, 32)
"""Group sizes ``mx.quantize`` supports that a head's values are cut into, preferred first."""
_BITS_AS = {mx.bfloat16: mx.uint16}  # numpy has no bfloat16: store its bits
_BY_NAME = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def storage_format(at_rest: str) -> str:
    """The storage format's name, for the model fingerprint."""
    if at_rest not in AT_REST_BITS:
        raise ValueError(f"KV at rest must be one of {', '.join(AT_REST_BITS)}, not {at_rest!r}")
    return FORMAT if at_rest == "lossless" else f"{FORMAT}+{at_rest}"


def check_at_rest(at_rest: str, spec: ModelCacheSpec) -> None:
    """Refuse at start a quantized at-rest format this model's head size cannot take, rather
    than failing every save (its KV would then live in memory only)."""
    if AT_REST_BITS.get(at_rest) is None:
        return
    for size in {spec.k_head_dim, spec.v_head_dim}:
        if _group(size) is None:
            raise UnsupportedModelError(
                f"--kv-at-rest {at_rest} quantizes each head's {size} values in groups of "
                f"{' or '.join(map(str, _GROUPS))}, and {size} is a multiple of neither; "
                "use --kv-at-rest lossless for this model"
            )


def _group(size: int) -> int | None:
    return next((group for group in _GROUPS if size % group == 0), None)


class MlxHostCodec:
    def __init__(
        self,
        at_rest: str = "lossless",
        buffers: RestoreBuffers | None = None,
        host: HostMemory = HOST_VIEWS,
    ) -> None:
        """``host``: whether block memory may be viewed by numpy (``devices.host_memory``);
        where not, ``buffers`` are never used."""
        self._format = storage_format(at_rest)
        self._bits = AT_REST_BITS[at_rest]
        self._buffers = (buffers or RestoreBuffers(max_bytes=0)) if host.addressable else None
        self._host = host

    def to_host(self, blocks: Sequence[KVBlock]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        tensors: dict[str, np.ndarray] = {}
        layers: list[str] = []
        dtype = ""
        views: dict[int, np.ndarray] = {}
        for block in blocks:
            layers.append(f"{block.layer}:{block.start}:{block.n_tokens}")
            in_place = self._bits is None and self._host.addressable
            rows = host_rows(block.payload, ALL, views) if in_place else None
            if rows is not None:  # float32 memory as it lies: no MLX op on the writer's thread
                tensors[f"{block.layer}.keys"], tensors[f"{block.layer}.values"] = rows
                dtype = str(rows[0].dtype)
                continue
            keys, values = kv_arrays(block.payload)
            dtype = _name(keys.dtype)
            for part, array in (("keys", keys), ("values", values)):
                name = f"{block.layer}.{part}"
                if self._bits is None:
                    tensors[name] = _host_view(array, copy=not self._host.addressable)
                else:
                    tensors |= _quantized(name, array, self._bits)
        return tensors, {"format": self._format, "dtype": dtype, "layers": ",".join(layers)}

    def reader(self) -> MlxHostReader:
        return MlxHostReader(self._format, self._bits, self._buffers)


class MlxHostReader:
    """Reads a block file into one MLX buffer; each tensor is a view into it (no copy).

    Without ``buffers`` (device memory, which numpy may not write in place), the file is
    read into host memory of its own, and the MLX buffer is made from it once read."""

    def __init__(self, storage: str, bits: int | None, buffers: RestoreBuffers | None) -> None:
        self._buffer: mx.array | None = None
        self._staged: np.ndarray | None = None
        self._format = storage
        self._bits = bits
        self._buffers = buffers

    def allocate(self, n_bytes: int) -> np.ndarray:
        if self._buffers is None:
            self._staged = np.empty(n_bytes, dtype=np.uint8)
            return self._staged
        self._buffer = self._buffers.take(n_bytes)
        view: np.ndarray = np.asarray(self._buffer)
        return view

    def finish(
        self, spans: Mapping[str, TensorSpan], metadata: Mapping[str, str]
    ) -> list[LayerPayload]:
        if self._staged is not None:  # one copy onto the device, on this thread
            self._buffer, self._staged = mx.array(self._staged), None
        if metadata.get("format") != self._format or self._buffer is None:
            raise CacheCorruptionError(f"unexpected block format {metadata.get('format')!r}")
        dtype = _BY_NAME[metadata["dtype"]]
        if self._bits is None and len({span.shape for span in spans.values()}) == 1:
            buffer, self._buffer = self._buffer, None
            return self._stacked(buffer, spans, metadata, dtype)
        tensors = self._tensors(spans, dtype)
        buffer, self._buffer = self._buffer, None
        # The tensors view the buffer (exact) or were computed from it (quantized): only
        # in the first case must it live as long as they do.
        owner = self._lease(buffer) if self._bits is None else None
        out = []
        for layer, start, n_tokens in _layers(metadata):
            kv = MlxKV(tensors[f"{layer}.keys"], tensors[f"{layer}.values"], owner)
            out.append(LayerPayload(layer, start, n_tokens, kv))
        if self._bits is not None and self._buffers is not None:
            self._buffers.give_back(buffer)
        return out

    def _lease(self, buffer: mx.array) -> object | None:
        """What keeps ``buffer`` from reuse while payloads view it (nothing where it is not
        a restore buffer: it then lives as long as they do)."""
        return self._buffers.lease(buffer) if self._buffers is not None else None

    def _stacked(
        self,
        buffer: mx.array,
        spans: Mapping[str, TensorSpan],
        metadata: Mapping[str, str],
        dtype: mx.Dtype,
    ) -> list[LayerPayload]:
        """Every tensor has one shape: each layer is a place in the stacked buffer, and no
        MLX op runs here (see ``StackedKV``). The file reader checked that the spans lie
        back to back from the start of the buffer."""
        order = {name: i for i, name in enumerate(spans)}  # spans come in file order
        shape = (len(order), *next(iter(spans.values())).shape)  # each (heads, n, head_dim)
        if math.prod(shape) * dtype.size != buffer.nbytes:  # caught here, not in a gather
            raise CacheCorruptionError(f"block data is not {len(order)} {dtype} tensors")
        owner = self._lease(buffer)
        out = []
        for layer, start, n_tokens in _layers(metadata):
            at_keys, at_values = order[f"{layer}.keys"], order[f"{layer}.values"]
            kv = StackedKV(buffer, dtype, shape, at_keys, at_values, owner)
            out.append(LayerPayload(layer, start, n_tokens, kv))
        return out

    def _tensors(self, spans: Mapping[str, TensorSpan], dtype: mx.Dtype) -> dict[str, mx.array]:
        """Every K and V tensor, evaluated here: a lazy op belongs to this thread's stream,
        and the engine thread could not run it."""
        if self._bits is None:
            tensors = self._views(spans, dtype)
        else:
            names = {name.rsplit(".", 1)[0] for name in spans}
            bits = self._bits
            tensors = {name: _dequantized(self._tensor, spans, name, dtype, bits) for name in names}
        mx.eval(list(tensors.values()))
        return tensors

    def _views(self, spans: Mapping[str, TensorSpan], dtype: mx.Dtype) -> dict[str, mx.array]:
        """A view per tensor: the tensors differ in shape (a sliding-window layer holds
        fewer positions), so the buffer is no one stack."""
        return {name: self._tensor(span, dtype) for name, span in spans.items()}

    def _tensor(self, span: TensorSpan, dtype: mx.Dtype) -> mx.array:
        if self._buffer is None:
            raise CacheCorruptionError("block data was never read")
        raw = self._buffer[span.begin : span.end].view(dtype)
        return raw.reshape(1, *span.shape)


def _dequantized(
    tensor: Callable[[TensorSpan, mx.Dtype], mx.array],
    spans: Mapping[str, TensorSpan],
    name: str,
    dtype: mx.Dtype,
    bits: int,
) -> mx.array:
    """One K or V tensor from its packed values, scales and biases; the group size is what
    the shapes say (``_GROUPS``)."""
    packed = tensor(spans[f"{name}.q"], mx.uint32)
    scales = tensor(spans[f"{name}.scales"], mx.float32)
    biases = tensor(spans[f"{name}.biases"], mx.float32)
    values = packed.shape[-1] * (32 // bits)
    if scales.shape[-1] == 0 or values % scales.shape[-1]:
        raise CacheCorruptionError(f"{name}: its scales do not match its values")
    group = values // scales.shape[-1]
    exact = mx.dequantize(packed, scales, biases, group_size=group, bits=bits)
    return exact.astype(dtype)


def _layers(metadata: Mapping[str, str]) -> tuple[tuple[int, int, int], ...]:
    """(layer, start, n_tokens) of each layer the file holds."""
    return _parse_layers(metadata["layers"])


@functools.lru_cache(maxsize=256)
def _parse_layers(text: str) -> tuple[tuple[int, int, int], ...]:
    """Cached: every whole block of a model lists the same layers, and parsing them took
    ~0.05 ms of each file's read, on a core both readers need."""
    out = []
    for entry in text.split(","):
        layer, start, n_tokens = (int(part) for part in entry.split(":"))
        out.append((layer, start, n_tokens))
    return tuple(out)


def _name(dtype: mx.Dtype) -> str:
    return next(name for name, value in _BY_NAME.items() if value == dtype)


def _quantized(name: str, array: mx.array, bits: int) -> dict[str, np.ndarray]:
    """Host copies, not views: MLX may reuse a temporary's buffer once nothing refers to it
    as an array (seen here: a second save of the same block wrote different bytes)."""
    group = _group(array.shape[-1])
    if group is None:  # check_at_rest refused this model at start
        raise ValueError(f"cannot quantize heads of {array.shape[-1]} values")
    parts = mx.quantize(array.astype(mx.float32), group_size=group, bits=bits)
    mx.eval(parts)
    packed, scales, biases = (np.array(part[0], copy=True) for part in parts)
    return {f"{name}.q": packed, f"{name}.scales": scales, f"{name}.biases": biases}


def _host_view(array: mx.array, *, copy: bool = False) -> np.ndarray:
    """The tensor's memory as numpy sees it; with ``copy``, a host copy of its own."""
    stored = array.view(_BITS_AS[array.dtype]) if array.dtype in _BITS_AS else array
    mx.eval(stored)
    view: np.ndarray = np.array(stored, copy=True)[0] if copy else np.asarray(stored)[0]
    return view
