"""The start's prefault: memory touched once the server answers, so the first restores
after a restart neither fault nor zero their buffers (ADR 0007, ADR 0032's amendments)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from semantic.adapters.mlx.cpu import prefault_heap
from semantic.adapters.mlx.kv.restore_buffers import RestoreBuffers
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.errors import ShuttingDownError

log = logging.getLogger(__name__)

RESERVE_WAIT_S = 60.0
"""How long the prefault waits for the engine's thread to make a restore buffer (a long
prompt chunk takes seconds); past it the prefault ends."""


MemoryWork = Callable[[Callable[[], bool]], None]
"""Work on the process's memory, given a ``go_ahead()`` to look at between its pieces."""


def prefault_work(
    n_bytes: int,
    spec: ModelCacheSpec,
    restore_buffers: RestoreBuffers,
    on_engine: Callable[[Callable[[], int]], int],
    idle: Callable[[], bool],
) -> MemoryWork:
    """``n_bytes`` touched up front so the first restores after a restart do not fault: as
    ready buffers for whole blocks read from disk, up to the buffers' cap, the rest touched
    and freed to the heap for the caches the engine builds. A buffer is made by
    ``on_engine`` (the engine's thread, where MLX runs, between two steps), so only while
    ``idle()`` (a busy engine would wait a buffer's faults: ~35-50 ms on a VM's fresh
    memory); ``on_engine`` failing (an engine stopped, or busy past its timeout) ends the
    prefault."""
    block_file_bytes = spec.bytes_per_token * spec.block_tokens

    def reserve_one() -> int:
        return restore_buffers.reserve(block_file_bytes, 1)

    def buffers(go_ahead: Callable[[], bool]) -> int | None:
        """Buffers made, each once idle; None where the prefault ends here."""
        made = 0
        for _ in range(restore_buffers.max_bytes // block_file_bytes):
            if not _idle_or_stopped(go_ahead, idle):
                return None
            try:
                if not on_engine(reserve_one):
                    return made  # the cap is reached (buffers given back meanwhile)
            except (TimeoutError, ShuttingDownError) as error:
                log.info("memory: the prefault ended after %d restore buffers: %s", made, error)
                return None
            made += 1
        return made

    def work(go_ahead: Callable[[], bool]) -> None:
        began = time.monotonic()
        made = buffers(go_ahead)
        if made is None:
            return
        heap = max(n_bytes - made * block_file_bytes, 0)
        touched = prefault_heap(heap, go_ahead=go_ahead)
        log.info(
            "memory: %d MiB of restore buffers and %d MiB of heap touched in %.1f s",
            made * block_file_bytes >> 20,
            touched >> 20,
            time.monotonic() - began,
        )

    return work


def _idle_or_stopped(go_ahead: Callable[[], bool], idle: Callable[[], bool]) -> bool:
    """True once ``idle()``, asking ``go_ahead()`` first and while not; False once it says
    stop."""
    while go_ahead():
        if idle():
            return True
    return False
