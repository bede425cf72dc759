"""The safetensors layout of a block file: written as pieces (no copy of the KV), read
back into memory the caller provides and hashed as it is read (ADR 0006)."""

from __future__ import annotations

import functools
import io
import json
import math
import os
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import xxhash

Allocate = Callable[[int], np.ndarray]
"""``allocate(n_bytes)`` -> a writable, C-contiguous uint8 array of that size to fill."""


@dataclass(frozen=True, slots=True)
class TensorSpan:
    """Where one tensor lies in a block file's data section."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


DTYPES = {"F32": np.float32, "F16": np.float16, "U16": np.uint16, "U32": np.uint32}
NAMES = {dtype: name for name, dtype in DTYPES.items()}
MAX_HEADER = 1 << 20
PIECE = 512 << 10


def safetensors_parts(
    tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]
) -> list[memoryview]:
    """A safetensors file as its pieces: the length and JSON header, then each tensor's own
    memory, in order (no copy of a C-contiguous tensor).

    Not the safetensors library's ``save``: it builds the whole file as one bytes object,
    a second copy of every block, while holding the GIL, up to 32 ms for one block here.
    That stalled the event loop, and with it every stream's tokens, whenever a save ran.
    Pieces let the kernel copy straight from the KV, with the GIL released.
    ``safetensors.numpy.load`` reads the result (a test checks)."""
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    data: list[memoryview] = []
    offset = 0
    for name, tensor in tensors.items():
        if not tensor.dtype.isnative:
            raise ValueError(f"tensor {name} is not in this machine's byte order")
        flat = np.ascontiguousarray(tensor).reshape(-1)  # keeps 0-d and empty tensors' shapes
        header[name] = {
            "dtype": NAMES[flat.dtype.type],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + flat.nbytes],
        }
        data.append(flat.view(np.uint8).data)
        offset += flat.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    return [memoryview(struct.pack("<Q", len(encoded)) + encoded), *data]


def write_all(handle: io.FileIO, part: memoryview) -> None:
    written = 0
    while written < len(part):
        written += handle.write(part[written:]) or 0


def read_verified(
    handle: io.FileIO, checksum: str, allocate: Allocate, stat: os.stat_result
) -> tuple[np.ndarray, Mapping[str, TensorSpan], Mapping[str, str]]:
    digest = xxhash.xxh3_128()
    prefix = handle.read(8)
    (header_size,) = struct.unpack("<Q", prefix)
    if header_size > MAX_HEADER:
        raise ValueError(f"header of {header_size} bytes")
    header_bytes = handle.read(header_size)
    digest.update(prefix)
    digest.update(header_bytes)
    spans, metadata, end = parse_header(header_bytes)
    if stat.st_size != 8 + header_size + end:
        raise ValueError(f"file is {stat.st_size} bytes, its header says {8 + header_size + end}")
    data = allocate(end)
    fill_hashing(handle, data.data.cast("B"), digest)
    if digest.hexdigest() != checksum:
        raise ValueError("checksum mismatch")
    return data, spans, metadata


@functools.lru_cache(maxsize=256)
def parse_header(
    header_bytes: bytes,
) -> tuple[Mapping[str, TensorSpan], Mapping[str, str], int]:
    """Where each tensor lies (in file order), the metadata, and where the data ends.

    Cached: every whole block of one model has the same header byte for byte, and parsing
    it in Python took ~0.2 ms of each file's read. The mappings are read-only."""
    header = json.loads(header_bytes)
    metadata = {str(k): str(v) for k, v in header.pop("__metadata__", {}).items()}
    spans: dict[str, TensorSpan] = {}
    end = 0
    for name, info in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
        begin, stop = (int(x) for x in info["data_offsets"])
        dtype = DTYPES[info["dtype"]]
        shape = tuple(int(d) for d in info["shape"])
        if begin != end or stop - begin != math.prod(shape) * np.dtype(dtype).itemsize:
            raise ValueError(f"tensor {name} does not match its header")
        spans[name] = TensorSpan(info["dtype"], shape, begin, stop)
        end = stop
    return MappingProxyType(spans), MappingProxyType(metadata), end


def fill_hashing(handle: io.FileIO, view: memoryview, digest: xxhash.xxh3_128) -> None:
    """Read into ``view`` and hash what was read while it is still in the core's cache: in
    pieces of ``PIECE`` bytes, the hash does not read the whole buffer back from memory
    (a three-block restore on two readers: 3.8 -> 2.7 ms; no change at seventeen)."""
    filled = 0
    while filled < len(view):
        got = handle.readinto(view[filled : filled + PIECE])
        if not got:
            raise ValueError("file ends inside its data")
        digest.update(view[filled : filled + got])
        filled += got
