"""Threads that are gone from the operating system, not only from Python, before it exits.

``Thread.join`` returns once a thread's Python code is done, but its native thread-local
destructors run after that, and MLX's take the GIL to drop Python objects. If the
interpreter is finalizing by then, that thread is made to exit inside the destructor and
the process aborts ("terminate called without an active exception", exit 134). Every
thread that touched MLX is at risk: the engine thread, block readers, and the workers
that load the model and write block files. A start and stop twice in one process aborted
about one run in six.

So the engine loop waits for its thread to be gone, and ``NativeThreadPool`` notes its
workers; at exit, before the interpreter starts finalizing, a hook waits until every noted
worker that has finished is gone too (Linux shows a thread in /proc until it is).
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_noted: set[int] = set()
_noted_lock = threading.Lock()


def wait_until_gone(native_ids: Iterable[int | None], timeout_s: float = 5.0) -> None:
    """Wait until no thread of ``native_ids`` still exists in the OS (``timeout_s`` in all)."""
    deadline = time.monotonic() + timeout_s
    for native_id in native_ids:
        if native_id is None:
            continue
        task = Path(f"/proc/self/task/{native_id}")
        while task.exists() and time.monotonic() < deadline:
            time.sleep(0.001)


class NativeThreadPool(ThreadPoolExecutor):
    """A thread pool whose workers are waited for at exit until the OS has let them go."""

    def __init__(self, max_workers: int | None = None, thread_name_prefix: str = "") -> None:
        super().__init__(max_workers, thread_name_prefix, initializer=_note_this_thread)


def _note_this_thread() -> None:
    with _noted_lock:
        if not _noted:
            # Runs before the interpreter finalizes, after non-daemon threads are joined;
            # asyncio.run has shut its default executor down by then.
            atexit.register(_wait_for_finished_workers)
        _noted.add(threading.get_native_id())


def _wait_for_finished_workers() -> None:
    running = {t.native_id for t in threading.enumerate() if t.is_alive()}
    with _noted_lock:
        finished = _noted - running
    wait_until_gone(finished)
