"""Keep freed KV buffers in the process instead of returning them to the kernel.

MLX's CPU allocator gets large buffers from glibc's malloc, which hands out anything over
128 KB as a fresh ``mmap`` and unmaps it on free: every restored or grown cache then pays
page faults on memory it just had (a 189 MB gather took 115 ms instead of 45). Raising the
mmap threshold, turning trimming off and using one arena makes freed KV memory reusable at
copy speed. The KV budget, not the allocator, bounds how much memory the server keeps.

A fresh process has no freed memory yet, so its first restores would still fault on every
page (a 4,096-token restore after a restart took 170 ms more than the same restore later).
``prefault_heap`` touches part of the budget once and frees it back to the heap, the way
GPU servers reserve their KV pool up front: a server does it beside itself once it answers
(the bootstrap's ``prefault_work``), as each fault in a VM's fresh memory cost 12-17 us
of kernel time on a Zen 4 VM (1.1-2.3 s for 512 MiB, a quarter of a start there).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys
from collections.abc import Callable

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
        and libc.mallopt(_M_TRIM_THRESHOLD, -1)  # never give the top of the heap back
    )
    if not applied:
        log.warning("could not tune malloc; restores will page-fault more")
    return bool(applied)


def prefault_heap(
    n_bytes: int, chunk: int = 8 << 20, go_ahead: Callable[[], bool] = lambda: True
) -> int:
    """Touch ``n_bytes`` of heap, in chunks below the mmap threshold, then free it all;
    ``go_ahead()`` before each chunk, False to stop there (a server shutting down).

    Returns how many bytes were touched (0 where the tuning does not apply: without it the
    freed chunks would go straight back to the kernel).
    """
    if not tune_malloc() or n_bytes <= 0:
        return 0
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    chunks: list[int] = []
    try:
        for _ in range(n_bytes // chunk):
            if not go_ahead():
                break
            address = libc.malloc(chunk)
            if not address:
                break
            ctypes.memset(address, 0, chunk)
            chunks.append(address)
    finally:
        for address in chunks:
            libc.free(address)
    return len(chunks) * chunk
