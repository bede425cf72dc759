"""Digests of model files, remembered by the files' identity on disk.

The fingerprint hashes a model's weights at every start: 0.26-0.45 s for the embedded
model's 538 MB on a Zen 3 VM (ADR 0005), seconds for a model of several GB. The files
rarely change, so the digest is kept in the model cache, keyed by each file's path, device,
inode, size, modification time and change time. Any write to a file moves its change time
(set by the kernel; no call sets it back), so a kept digest is never taken for other bytes.
The kernel's clock for those times is coarse (a few ms), so, as git does with its index, a
digest is kept only for files unchanged while they were hashed and last changed well before
(a write in the same tick as the hashing would leave the times as they were). A memo that
cannot be read or written costs only the hashing. It keeps the newest ``KEPT`` digests
(models in passing directories, a test's say, would otherwise pile up).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

SETTLED_NS = 2_000_000_000  # how long ago the files' last change must be for a digest to be kept
KEPT = 64


class DigestMemo:
    def __init__(self, directory: Path, clock_ns: Callable[[], int] = time.time_ns) -> None:
        """``clock_ns``: the wall clock the files' change times are compared with."""
        self.directory = directory
        self.clock_ns = clock_ns

    def digest(self, paths: Sequence[Path], compute: Callable[[Sequence[Path]], str]) -> str:
        """``compute(paths)``, or what it gave for these files as they are on disk now."""
        before = _described(paths)
        entry = self.directory / f"{_identity(before)}.digest"
        try:
            return entry.read_text().strip()
        except OSError:
            pass
        digest = compute(paths)
        last_change = max(described[-1] for described in before)
        if _described(paths) == before and last_change < self.clock_ns() - SETTLED_NS:
            self._keep(entry, digest)
        return digest

    def _keep(self, entry: Path, digest: str) -> None:
        partial = entry.with_suffix(f".{os.getpid()}.partial")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            partial.write_text(digest)
            partial.replace(entry)  # whole or absent, whoever else writes it
            self._prune()
        except OSError as error:
            log.debug("could not keep the weights' digest in %s: %s", self.directory, error)
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)

    def _prune(self) -> None:
        entries = sorted(self.directory.glob("*.digest"), key=_modified, reverse=True)
        for stale in entries[KEPT:]:
            stale.unlink(missing_ok=True)


def _modified(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0  # gone meanwhile: first to go


def _described(paths: Sequence[Path]) -> list[tuple[str, int, int, int, int, int]]:
    """What changes whenever any of the files' bytes could have (the change time last)."""
    described = []
    for path in paths:
        status = path.stat()
        described.append(
            (
                str(path.resolve()),
                status.st_dev,
                status.st_ino,
                status.st_size,
                status.st_mtime_ns,
                status.st_ctime_ns,
            )
        )
    return described


def _identity(described: list[tuple[str, int, int, int, int, int]]) -> str:
    encoded = json.dumps(described).encode()
    return hashlib.blake2b(encoded, digest_size=16).hexdigest()
