"""One process per data directory.

Two servers on one directory would each believe their pool's view of the blocks and the
metadata is the whole truth: one collects block files the other still points at, and
their reference counts drift apart. So a process holds an exclusive ``flock`` on
``<data dir>/lock`` while it uses the store. The kernel drops the lock when the process
dies, however it dies, so a crash never leaves a stale lock to clean up by hand. The file
holds the holder's pid, for the message a second process gets.

Within one process the lock is re-entrant (the CLI takes it before loading the model, to
fail fast; the services take it again and give it back when they stop).
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from semantic.domain.errors import DataDirectoryInUseError, DataDirectoryUnusableError

_held: dict[Path, tuple[int, int]] = {}  # resolved directory -> (fd, holders in this process)
_guard = threading.Lock()


def acquire_data_directory(directory: Path) -> Path:
    """Hold ``directory`` for this process; returns the key to ``release_data_directory``.
    Raises ``DataDirectoryInUseError`` when another process holds it."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise DataDirectoryUnusableError(
            f"the data directory {directory} is a file, not a directory (or lies under one)"
        ) from None
    except OSError as error:  # no such parent on a read-only tree, no permission, ...
        raise DataDirectoryUnusableError(
            f"the data directory {directory} cannot be created ({error.strerror}); "
            "Fix: pass --data-dir a directory this user may write"
        ) from None
    key = directory.resolve()
    with _guard:
        if key in _held:
            fd, holders = _held[key]
            _held[key] = (fd, holders + 1)
            return key
        fd = os.open(key / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DataDirectoryInUseError(str(key), holder) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            os.close(fd)
            raise
        _held[key] = (fd, 1)
        return key


def release_data_directory(key: Path) -> None:
    """Give back one hold; the lock goes when the last holder in this process lets go.
    Releasing a directory this process does not hold does nothing."""
    with _guard:
        if key not in _held:
            return
        fd, holders = _held.pop(key)
        if holders > 1:
            _held[key] = (fd, holders - 1)
            return
        os.close(fd)  # closing the descriptor drops the flock
