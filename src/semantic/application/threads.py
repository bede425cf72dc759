"""Threads that are gone from the operating system, not only from Python, before it exits.

``Thread.join`` returns once a thread's Python code is done, but its native thread-local
destructors run after that, and MLX's take the GIL to drop Python objects. If the
interpreter is finalizing by then, that thread is made to exit inside the destructor and
the process aborts ("terminate called without an active exception", exit 134). Every
thread that touched MLX is at risk: the engine thread, block readers, and the workers
that load the model and write block files. A start and stop twice in one process aborted
about one run in six.

So the engine loop waits for its thread to be gone, and ``NativeThreadPool`` (the block
readers, and every loop's ``to_thread`` workers once ``install_default_executor`` ran)
notes its workers; at exit, before the interpreter starts finalizing, a hook waits until
every noted worker that has finished is gone too (Linux shows a thread in /proc until it
is; ``semantic serve`` ends with ``os._exit`` and never needed it).
"""

from __future__ import annotations

import asyncio
import atexit
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_noted: set[tuple[int, str | None]] = set()  # (native id, start time: ids get reused)
_noted_lock = threading.Lock()


def wait_until_gone(native_ids: Iterable[int | None], timeout_s: float = 5.0) -> None:
    """Wait until no thread of ``native_ids`` still exists in the OS (``timeout_s`` in all).
    Linux only: elsewhere there is no /proc to ask, and this returns at once."""
    _wait_for([(native_id, None) for native_id in native_ids if native_id is not None], timeout_s)


class NativeThreadPool(ThreadPoolExecutor):
    """A thread pool whose workers are waited for at exit until the OS has let them go.
    ``on_start`` runs first in each worker."""

    def __init__(
        self,
        max_workers: int | None = None,
        thread_name_prefix: str = "",
        on_start: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(
            max_workers, thread_name_prefix, initializer=_note_this_thread, initargs=(on_start,)
        )


def install_default_executor(loop: asyncio.AbstractEventLoop) -> None:
    """Make ``loop``'s ``to_thread`` workers a ``NativeThreadPool``, once per loop (a
    replaced default executor is not shut down, so installing twice would leave one)."""
    if loop not in _installed:
        loop.set_default_executor(NativeThreadPool(thread_name_prefix="io"))
        _installed.add(loop)


_installed: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def _note_this_thread(on_start: Callable[[], None] | None = None) -> None:
    if on_start is not None:
        on_start()
    native_id = threading.get_native_id()
    with _noted_lock:
        if not _noted:
            # Runs before the interpreter finalizes, after non-daemon threads are joined;
            # asyncio.run has shut its default executor down by then.
            atexit.register(_wait_for_finished_workers)
        _noted.add((native_id, _start_time(native_id)))


def _wait_for_finished_workers() -> None:
    running = {t.native_id for t in threading.enumerate() if t.is_alive()}
    with _noted_lock:
        finished = [(tid, started) for tid, started in _noted if tid not in running]
    _wait_for(finished, timeout_s=5.0)


def _wait_for(threads: list[tuple[int, str | None]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for native_id, started in threads:
        while time.monotonic() < deadline:
            now = _start_time(native_id)
            if now is None or (started is not None and now != started):
                break  # gone, or the id now names another thread
            time.sleep(0.001)


def _start_time(native_id: int) -> str | None:
    """The thread's start time (field 22 of its stat), None if it is gone."""
    try:
        stat = Path(f"/proc/self/task/{native_id}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]
