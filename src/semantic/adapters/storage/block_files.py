"""Block files: one safetensors file per block key, written durably, verified on read.

Writes go to a temporary name in the final directory, are fsynced, renamed into place, and
the directory is fsynced: a crash leaves either the whole file or a ``*.tmp`` that the next
start removes. Reads stream each tensor straight into memory the caller provides (for KV,
MLX's own buffers), hashing as they go; the xxh3-128 of the whole file must equal the
checksum recorded when it was written. ADR 0006 explains the layout and the order.

Files no block needs any more are kept, up to ``SPARES`` of them, and written over by the
next writes instead of new files: see ``BlockFiles.delete``.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import math
import os
import secrets
import shutil
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np
import xxhash

from semantic.adapters.files import fsync_directory
from semantic.domain.errors import CacheCorruptionError, DataDirectoryUnusableError

log = logging.getLogger(__name__)

Allocate = Callable[[int], np.ndarray]
"""``allocate(n_bytes)`` -> a writable, C-contiguous uint8 array of that size to fill."""


@dataclass(frozen=True, slots=True)
class TensorSpan:
    """Where one tensor lies in a block file's data section."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


_DTYPES = {"F32": np.float32, "F16": np.float16, "U16": np.uint16, "U32": np.uint32}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
_MAX_HEADER = 1 << 20
_PIECE = 512 << 10
SUFFIX = ".safetensors"
SPARES = 4
"""Unneeded block files kept to be written over: at most this many (~12 MB each here)."""
HEADROOM = 2 << 20
"""Bytes of the headroom file: room for the transactions that record evictions (a few
pages each) when the disk is full."""
SPARE_AGE_S = 0.25
"""A spare is written over only this long after its block was collected, so a restore that
opened the block's file just before (a file's read takes milliseconds, a whole restore well
under 0.1 s) has finished with it."""


class BlockFiles:
    def __init__(self, root: Path) -> None:
        for directory in (root, root.parent / "quarantine"):
            if directory.exists() and not directory.is_dir():
                raise DataDirectoryUnusableError(f"{directory} is a file, not a directory")
        self.root = root
        self.quarantine_dir = root.parent / "quarantine"
        self.spare_dir = root / "spare"
        self._spares: list[tuple[Path, float]] = [
            (path, 0.0) for path in sorted(self.spare_dir.glob("*.spare"))
        ]  # (file, when it was collected); a previous run's are old enough
        self._spare_lock = threading.Lock()
        self.headroom_path = root.parent / "headroom"

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}{SUFFIX}"

    def free_bytes(self) -> int | None:
        for where in (self.root, self.root.parent):  # ``blocks/`` comes with the first block
            try:
                return shutil.disk_usage(where).free
            except OSError:
                continue
        return None

    def write(
        self, key: str, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]
    ) -> tuple[int, str]:
        """Write durably; returns (bytes, checksum). An existing key's file is kept and its
        own checksum returned (it may have been written by an older version, in another
        order)."""
        target = self.path(key)
        if target.exists():
            existing = target.read_bytes()
            return len(existing), xxhash.xxh3_128_hexdigest(existing)
        parts = safetensors_parts(tensors, metadata)
        digest = xxhash.xxh3_128()
        for part in parts:
            digest.update(part)
        return self._write_parts(target, parts), digest.hexdigest()

    def has(self, key: str) -> bool:
        return self.path(key).exists()

    def file_bytes(self, key: str, checksum: str) -> bytes | None:
        """The whole file, if it is there and matches ``checksum`` (it may have been
        collected, even written over as a spare, since its row was read)."""
        try:
            data = self.path(key).read_bytes()
        except OSError:
            return None
        return data if xxhash.xxh3_128_hexdigest(data) == checksum else None

    def _write_parts(self, target: Path, parts: list[memoryview]) -> int:
        """Write ``parts`` as ``target``: temporary name, fsync, rename, fsync of the
        directory; returns the bytes written."""
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        n_bytes = sum(len(part) for part in parts)
        try:
            with self._open_for_writing(temporary) as handle:
                for part in parts:
                    _write_all(handle, part)
                handle.truncate(n_bytes)  # a spare may have been longer
                os.fsync(handle.fileno())
            os.replace(temporary, target)
        except BaseException:  # a full disk, say: the partial file goes now, not at a restart
            temporary.unlink(missing_ok=True)
            raise
        fsync_directory(target.parent)
        return n_bytes

    def _open_for_writing(self, temporary: Path) -> io.FileIO:
        """A spare renamed to ``temporary`` and opened without truncation, so the write
        lands in pages the page cache (and the disk) already hold; else a new file."""
        spare = self._take_spare()
        if spare is not None:
            try:
                os.replace(spare, temporary)
                handle = open(temporary, "r+b", buffering=0)  # noqa: SIM115 - the caller closes it
            except OSError:
                pass  # gone or unusable: a new file does as well
            else:
                if os.fstat(handle.fileno()).st_nlink == 1:
                    return handle
                handle.close()  # another name still reaches these bytes: leave them be
                temporary.unlink(missing_ok=True)
        return open(temporary, "wb", buffering=0)

    def _take_spare(self) -> Path | None:
        ready = time.monotonic() - SPARE_AGE_S
        with self._spare_lock:
            for index, (path, collected) in enumerate(self._spares):
                if collected <= ready:
                    del self._spares[index]
                    return path
        return None

    def read(
        self, key: str, checksum: str, allocate: Allocate
    ) -> tuple[np.ndarray, Mapping[str, TensorSpan], Mapping[str, str]]:
        """Read the file's whole data section, in one go, into ``allocate(n_bytes)``.

        Returns the buffer, where each tensor lies in it (in file order), and the file's
        metadata. Raises ``CacheCorruptionError`` if the file is missing, truncated,
        malformed or does not match ``checksum``.
        """
        path = self.path(key)
        try:
            with open(path, "rb", buffering=0) as handle:
                return _read_verified(handle, checksum, allocate, os.fstat(handle.fileno()))
        except FileNotFoundError:
            raise CacheCorruptionError(f"block file {path.name} is missing") from None
        except (OSError, ValueError, KeyError, TypeError, struct.error) as error:
            raise CacheCorruptionError(f"block file {path.name} is unreadable: {error}") from error

    def parse(
        self, key: str, data: bytes, checksum: str, allocate: Allocate
    ) -> tuple[np.ndarray, Mapping[str, TensorSpan], Mapping[str, str]]:
        """``read`` of a block file held in memory (one read from the shared tier): the
        same checks, the data section copied into ``allocate(n_bytes)``."""
        try:
            if xxhash.xxh3_128_hexdigest(data) != checksum:
                raise ValueError("checksum mismatch")
            (header_size,) = struct.unpack_from("<Q", data)
            if header_size > _MAX_HEADER:
                raise ValueError(f"header of {header_size} bytes")
            spans, metadata, end = _parse_header(data[8 : 8 + header_size])
            if len(data) != 8 + header_size + end:
                raise ValueError(f"{len(data)} bytes, the header says {8 + header_size + end}")
            buffer = allocate(end)
            buffer[:] = np.frombuffer(data, np.uint8, end, 8 + header_size)
        except (ValueError, KeyError, TypeError, struct.error) as error:
            raise CacheCorruptionError(f"block {key[:16]} is unreadable: {error}") from error
        return buffer, spans, metadata

    def quarantine(self, key: str) -> Path | None:
        """Move a bad file aside for inspection; returns where it went (None if missing, or
        if it could not be kept). Where it cannot be moved there (``blocks/`` on another
        filesystem, a read-only quarantine), it is deleted; where it cannot be deleted
        either, it stays: the caller marks its row, and a bad file is never read as good."""
        source = self.path(key)
        if not source.exists():
            return None
        target = self.quarantine_dir / f"{key}.{int(time.time())}{SUFFIX}"
        try:
            self.quarantine_dir.mkdir(parents=True, exist_ok=True)
            os.replace(source, target)
        except OSError as error:
            log.warning("cannot move block file %s into quarantine (%s)", source.name, error)
            with contextlib.suppress(OSError):
                source.unlink()
            return None
        return target

    def delete(self, key: str) -> None:
        """Remove a block's file; up to ``SPARES`` are kept aside to be written over.

        A new file's pages are memory the kernel must find and zero, and this VM gives
        memory idle for a second back to its host: writing a fresh 11.8 MB block took
        5-24 ms, writing over a kept file 3-6 ms (fsync 7-9 ms either way). Each turn
        collects its conversation's previous partial block, so a spare is usually there.
        The old name's removal is made durable (its directory fsynced) before the spare can
        be written over: a crash must never bring back a block's name over other bytes,
        since an existing file's checksum is trusted when the same key is written again."""
        path = self.path(key)
        with self._spare_lock:
            if self._adopt_as_headroom(path):
                return
            if len(self._spares) >= SPARES:
                path.unlink(missing_ok=True)
                return
            self.spare_dir.mkdir(exist_ok=True)
            spare = self.spare_dir / f"{secrets.token_hex(8)}.spare"
            try:
                os.replace(path, spare)
            except FileNotFoundError:
                return
            fsync_directory(path.parent)
            self._spares.append((spare, time.monotonic()))

    def _adopt_as_headroom(self, path: Path) -> bool:
        """Where the headroom file was given up (a full disk), a collected block's file
        becomes it, cut to size: deleting the file and making a new one would let another
        program take the room in between. Its old name goes durably first, as a spare's."""
        if self.headroom_path.exists():
            return False
        temporary = self.headroom_path.with_name(f"headroom.{os.getpid()}.tmp")
        try:
            if path.stat().st_size < HEADROOM:
                return False
            os.replace(path, temporary)
        except OSError:
            return False
        try:
            fsync_directory(path.parent)
            os.truncate(temporary, HEADROOM)
            os.replace(temporary, self.headroom_path)
        except OSError:
            temporary.unlink(missing_ok=True)  # the block's name is gone either way
        return True

    def keys(self) -> set[str]:
        return {p.name[: -len(SUFFIX)] for p in self.root.glob(f"*/*{SUFFIX}")}

    def release_space(self, *, headroom: bool) -> int:
        """Free the disk this store holds only to reuse: the spare files, and with
        ``headroom`` the headroom file too; returns the bytes freed."""
        with self._spare_lock:
            spares, self._spares = self._spares, []
        freed = sum(_remove(path) for path, _ in spares)
        if headroom:
            freed += _remove(self.headroom_path)
        return freed

    def keep_headroom(self, *, leaving: int) -> bool:
        """Make the headroom file (``HEADROOM`` bytes) if it is missing and the disk has
        room for it and ``leaving`` bytes more; returns whether it is there.

        On a disk another program filled, the transaction that records an eviction needs
        room of its own before the eviction frees any: deleting this file gives it that."""
        if self.headroom_path.exists():
            return True
        free = self.free_bytes()
        if free is None or free < HEADROOM + leaving:
            return False
        temporary = self.headroom_path.with_name(f"headroom.{os.getpid()}.tmp")
        try:
            with open(temporary, "wb", buffering=0) as handle:
                os.posix_fallocate(handle.fileno(), 0, HEADROOM)
                os.fsync(handle.fileno())
            os.replace(temporary, self.headroom_path)
        except OSError as error:
            temporary.unlink(missing_ok=True)
            log.warning("cannot keep the headroom file %s (%s)", self.headroom_path, error)
            return False
        return True

    def remove_temporaries(self) -> int:
        """Delete ``*.tmp`` files a crash left behind; returns how many."""
        stray = [*self.root.glob("*/*.tmp"), *self.root.parent.glob("headroom.*.tmp")]
        for path in stray:
            path.unlink(missing_ok=True)
        return len(stray)


def _remove(path: Path) -> int:
    """Delete a file; returns the bytes it held (0 if it was gone already)."""
    try:
        size = path.stat().st_blocks * 512
        path.unlink()
    except FileNotFoundError:
        return 0
    return size


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
            "dtype": _NAMES[flat.dtype.type],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + flat.nbytes],
        }
        data.append(flat.view(np.uint8).data)
        offset += flat.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    return [memoryview(struct.pack("<Q", len(encoded)) + encoded), *data]


def _write_all(handle: io.FileIO, part: memoryview) -> None:
    written = 0
    while written < len(part):
        written += handle.write(part[written:]) or 0


def _read_verified(
    handle: io.FileIO, checksum: str, allocate: Allocate, stat: os.stat_result
) -> tuple[np.ndarray, Mapping[str, TensorSpan], Mapping[str, str]]:
    digest = xxhash.xxh3_128()
    prefix = handle.read(8)
    (header_size,) = struct.unpack("<Q", prefix)
    if header_size > _MAX_HEADER:
        raise ValueError(f"header of {header_size} bytes")
    header_bytes = handle.read(header_size)
    digest.update(prefix)
    digest.update(header_bytes)
    spans, metadata, end = _parse_header(header_bytes)
    if stat.st_size != 8 + header_size + end:
        raise ValueError(f"file is {stat.st_size} bytes, its header says {8 + header_size + end}")
    data = allocate(end)
    _fill_hashing(handle, data.data.cast("B"), digest)
    if digest.hexdigest() != checksum:
        raise ValueError("checksum mismatch")
    return data, spans, metadata


@functools.lru_cache(maxsize=256)
def _parse_header(
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
        dtype = _DTYPES[info["dtype"]]
        shape = tuple(int(d) for d in info["shape"])
        if begin != end or stop - begin != math.prod(shape) * np.dtype(dtype).itemsize:
            raise ValueError(f"tensor {name} does not match its header")
        spans[name] = TensorSpan(info["dtype"], shape, begin, stop)
        end = stop
    return MappingProxyType(spans), MappingProxyType(metadata), end


def _fill_hashing(handle: io.FileIO, view: memoryview, digest: xxhash.xxh3_128) -> None:
    """Read into ``view`` and hash what was read while it is still in the core's cache: in
    pieces of ``_PIECE`` bytes, the hash does not read the whole buffer back from memory
    (a three-block restore on two readers: 3.8 -> 2.7 ms; no change at seventeen)."""
    filled = 0
    while filled < len(view):
        got = handle.readinto(view[filled : filled + _PIECE])
        if not got:
            raise ValueError("file ends inside its data")
        digest.update(view[filled : filled + got])
        filled += got
