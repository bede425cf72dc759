"""Progress lines for long work (downloads, conversion), on stderr so stdout stays clean."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressPrinter:
    """``progress(stage, done, total)``: a live line on a terminal, sparse lines otherwise."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._stage = ""
        self._last = 0.0

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        if total <= 1:
            if stage != self._stage:
                self._stream.write(f"{stage}\n")
                self._stream.flush()
                self._stage, self._last = stage, now
            return
        finished = done >= total
        if stage == self._stage and not finished and now - self._last < 0.5:
            return
        percent = 100 * done // max(total, 1)
        line = f"{stage}: {percent:3d}% ({done}/{total})"
        if self._tty:
            self._stream.write(f"\r\x1b[2K{line}" + ("\n" if finished else ""))
        elif finished or stage != self._stage:
            self._stream.write(line + "\n")
        self._stream.flush()
        self._stage, self._last = stage, now
