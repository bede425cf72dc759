"""The weights' move onto huge pages (``huge_pages``) as it runs: at load, or beside the
server once it answers, a page at a time on a thread of its own that Linux runs only on a
CPU with nothing else to do (SCHED_IDLE), and only while the engine has no request (ADR
0032).

Both, because a page on the move holds the address space's lock and takes a CPU for ~7 ms:
at nice 0 or 19, a slow-client flood's ordinary requests (0.2 s) took 2.1-2.3 s (the move
took the CPU, or, preempted at nice 19, held the lock while every thread that faulted
waited for it); under SCHED_IDLE they met their 2 s three times of three.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from semantic.adapters.mlx.cpu.huge_pages import (
    AT_LOAD,
    HUGE_PAGE,
    HUGE_PAGES_ENV,
    Collapse,
    Span,
    WeightPages,
    collapse_spans,
    huge_page_size,
    madvise_collapse,
    obstacle,
    weight_spans,
)

log = logging.getLogger(__name__)

PATIENCE_S = 2.0
"""How long a page waits for an idle engine before it moves anyway: a busy server still
gets its huge pages, a page (~7 ms of stalls on the Zen 3 VM of ADR 0032) every two
seconds, where a CPU has a moment free."""
IDLE_POLL_S = 0.05


class PagePlacement:
    """The weights' move onto huge pages, on a thread of its own, started once the server
    is up (``start``): while a page moves, the process's address space is locked (~7 ms a
    page on the Zen 3 VM of ADR 0032), and a start that faults its KV memory in waited for
    every page. The weights stay readable throughout."""

    def __init__(
        self, spans: list[Span], collapse: Collapse, page: int, over: WeightPages | None = None
    ) -> None:
        """``over``: a placement with nothing to do, already over (the weights' move ruled
        out, or done at load)."""
        self._work = (spans, collapse, page)
        self._pages = over
        self._started = over is not None
        self._done = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[WeightPages], None]] = []
        if over is not None:
            self._done.set()

    @classmethod
    def ruled_out(cls, why: str) -> PagePlacement:
        return cls([], _no_collapse, HUGE_PAGE, WeightPages(0, 0, why))

    def start(
        self,
        idle: Callable[[], bool] = lambda: True,
        patience: float = PATIENCE_S,
        before: Callable[[Callable[[], bool]], object] | None = None,
    ) -> bool:
        """The move begins, a page at a time whenever ``idle()`` says the server has nothing
        to do, or once ``patience`` seconds passed without (once; later calls do nothing).
        Moving beside a decode stream, the first reply after a start ran at 16 tokens/s
        instead of 36 on that VM: pages are locked while they move. ``before(go_ahead)``:
        work for the same thread ahead of the move, under the same gate (the heap's
        prefault: its faults would wait for pages on the move). False where no move began
        (over, or begun before): then ``before`` did not run."""
        with self._lock:
            if self._started:
                return False
            self._started = True
        threading.Thread(
            target=self._run, args=(idle, patience, before), name="huge-pages", daemon=True
        ).start()
        return True

    @property
    def pages(self) -> WeightPages | None:
        """What landed; None until the move is over."""
        return self._pages

    def wait(self, timeout: float | None = None) -> WeightPages | None:
        """The move started if it was not, and waited for."""
        self.start()
        self._done.wait(timeout)
        return self._pages

    def when_done(self, callback: Callable[[WeightPages], None]) -> None:
        """``callback(pages)`` once the move is over: now if it is (on this thread), else
        on the placement's thread."""
        with self._lock:
            if self._pages is None:
                self._callbacks.append(callback)
                return
        callback(self._pages)

    def stop(self) -> None:
        """No page moved after the one under way (those moved stay moved)."""
        self._stop.set()

    def _run(
        self,
        idle: Callable[[], bool],
        patience: float,
        before: Callable[[Callable[[], bool]], object] | None,
    ) -> None:
        _only_when_a_cpu_is_idle()
        go_ahead = functools.partial(self._go_ahead, idle, patience)
        if before is not None:
            try:
                before(go_ahead)
            except Exception:  # whatever failed there, the weights still move
                log.exception("the work before the weights' move failed; the move goes on")
        began = time.monotonic()
        spans, collapse, page = self._work
        pages = collapse_spans(spans, collapse, page, go_ahead)
        took = time.monotonic() - began
        log.info("weights: %s (moved in %.1f s)", pages.describe(), took)
        with self._lock:
            self._pages, callbacks = pages, self._callbacks
            self._callbacks = []
        try:  # told before a waiter wakes: it finds them told
            for callback in callbacks:
                callback(pages)
        finally:
            self._done.set()

    def _go_ahead(self, idle: Callable[[], bool], patience: float) -> bool:
        """Before each page: an idle engine waited for, ``patience`` seconds at most;
        False once told to stop."""
        deadline = time.monotonic() + patience
        while not idle() and time.monotonic() < deadline and not self._stop.wait(IDLE_POLL_S):
            pass
        return not self._stop.is_set()


def placement_for(
    model: Any, *, later: bool, environ: Mapping[str, str] = os.environ
) -> PagePlacement:
    """The move of ``model``'s parameters onto huge pages where this machine allows it: done
    now, or with ``later`` to be started (``SEMANTIC_HUGE_PAGES=at-load``: now regardless)."""
    import mlx.core as mx

    if mx.default_device() != mx.cpu:
        return PagePlacement.ruled_out("the weights live on a GPU")
    if (why := obstacle(sys.platform, environ)) is not None:
        return PagePlacement.ruled_out(why)
    if (collapse := madvise_collapse()) is None:
        return PagePlacement.ruled_out("no madvise in this C library")
    placement = PagePlacement(weight_spans(model), collapse, huge_page_size())
    if not later or environ.get(HUGE_PAGES_ENV) == AT_LOAD:
        placement.wait()
    return placement


def place_weights(model: Any) -> WeightPages:
    """The move, done now."""
    pages = placement_for(model, later=False).wait()
    assert pages is not None  # waited without a timeout
    return pages


def _no_collapse(_start: int, _length: int) -> int:
    return errno.ENOSYS


def _only_when_a_cpu_is_idle() -> None:
    """Linux's SCHED_IDLE, for this thread alone (its id 0 is the caller)."""
    with contextlib.suppress(OSError, AttributeError):  # else at the server's priority
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
