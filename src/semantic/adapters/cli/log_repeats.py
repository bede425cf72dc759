"""A logging filter that lets a repeated line through a few times, then counts it.

A server in trouble tends to say the same thing in a loop: asyncio logged "Too many open
files" 277,231 times in 40 s once, 128 MB of log (issue 32), which hides everything else
and can fill the disk. Lines that look alike (same logger, level and message with its
numbers masked), warnings and errors only, get ``burst`` lines per ``window_s``; the rest
are dropped and counted, and the next line of that kind let through says how many were
dropped. Lines below ``level`` (a line for each request at INFO, say) always pass.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

_NUMBERS = re.compile(r"\d+")
KEY_CHARS = 200
"""How much of a message tells one kind of line from another."""
MAX_KINDS = 1024
"""Kinds remembered at once: the oldest windows are forgotten past it."""


@dataclass(slots=True)
class _Window:
    started: float
    passed: int = 0
    dropped: int = 0


class RepeatFilter(logging.Filter):
    def __init__(
        self,
        burst: int = 5,
        window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        level: int = logging.WARNING,
    ) -> None:
        super().__init__()
        self._level = level
        self._burst = burst
        self._window_s = window_s
        self._clock = clock
        self._windows: dict[tuple[str, int, str], _Window] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self._level:
            return True  # one line a request, say, that a reader counts on
        key = (record.name, record.levelno, _kind(record))
        now = self._clock()
        window = self._windows.get(key)
        if window is None or now - window.started >= self._window_s:
            dropped = window.dropped if window is not None else 0
            window = self._windows[key] = _Window(now)
            self._forget_oldest()
            if dropped:
                _note_dropped(record, dropped)
        if window.passed >= self._burst:
            window.dropped += 1
            return False
        window.passed += 1
        return True

    def _forget_oldest(self) -> None:
        while len(self._windows) > MAX_KINDS:
            del self._windows[next(iter(self._windows))]


def _kind(record: logging.LogRecord) -> str:
    text = record.msg if isinstance(record.msg, str) else repr(record.msg)
    if record.exc_info and record.exc_info[1] is not None:
        text += type(record.exc_info[1]).__name__
    return _NUMBERS.sub("#", text[:KEY_CHARS])


def _note_dropped(record: logging.LogRecord, dropped: int) -> None:
    """Say, on the line let through, how many like it were dropped before it."""
    record.msg = f"{record.msg} [{dropped} more like this were dropped before this line]"
