"""Keep freed KV buffers in the process instead of returning them to the kernel.

MLX's CPU allocator gets large buffers from glibc's malloc, which hands out anything over
128 KB as a fresh ``mmap`` and unmaps it on free: every restored or grown cache then pays
page faults on memory it just had (a 189 MB gather took 115 ms instead of 45). Raising the
mmap and trim thresholds and using one arena makes freed KV memory reusable at copy speed.
The KV budget, not the allocator, bounds how much memory the server keeps.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit
TUNING_ENV = "SEMANTIC_MALLOC_TUNING"


@functools.cache
def tune_malloc() -> bool:
    """Apply the tuning once, before large allocations; False where it does not apply."""
    if not sys.platform.startswith("linux") or os.environ.get(TUNING_ENV) == "0":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False  # not glibc (musl): leave the allocator alone
    applied = (
        libc.mallopt(_M_ARENA_MAX, 1)
        and libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)
        and libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)
    )
    if not applied:
        log.warning("could not tune malloc; restores will page-fault more")
    return bool(applied)
