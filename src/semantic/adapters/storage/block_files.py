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
import io
import logging
import os
import secrets
import shutil
import struct
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import xxhash

from semantic.adapters.files import fsync_directory
from semantic.adapters.storage.safetensors_layout import (
    MAX_HEADER,
    Allocate,
    TensorSpan,
    parse_header,
    read_verified,
    safetensors_parts,
    write_all,
)
from semantic.domain.errors import CacheCorruptionError, DataDirectoryUnusableError

log = logging.getLogger(__name__)

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
                    write_all(handle, part)
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
                return read_verified(handle, checksum, allocate, os.fstat(handle.fileno()))
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
            if header_size > MAX_HEADER:
                raise ValueError(f"header of {header_size} bytes")
            spans, metadata, end = parse_header(data[8 : 8 + header_size])
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
