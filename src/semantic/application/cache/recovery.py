"""At start, the block files and the metadata brought back into agreement after a crash.

A crash can leave half-written files, files no row knows (written, never committed), rows
no agent uses (committed, then superseded) and rows whose file is gone. The writer
(``Saver``) runs this before it takes its first job, so no save races it.
"""

from __future__ import annotations

import asyncio
import logging

from semantic.application.cache.stats import CacheStats
from semantic.domain.errors import DiskFullError
from semantic.ports.block_store import BlockStore
from semantic.ports.metadata_store import BlockRecords

log = logging.getLogger(__name__)


async def recover(
    store: BlockStore, block_records: BlockRecords, stats: CacheStats, *, shared: bool
) -> None:
    """Remove half-written files, files no row knows and rows no one uses; quarantine rows
    whose file is gone (they point nowhere), unless a shared tier may hold them."""
    temporaries = await asyncio.to_thread(store.remove_temporaries)
    files = await asyncio.to_thread(store.keys)
    rows = await block_records.all_block_keys()
    unreferenced = await block_records.unreferenced_blocks()
    try:
        await block_records.delete_blocks(unreferenced)
    except DiskFullError as error:  # their files stay with their rows, till next time
        log.warning("recovery could not drop unused block rows: %s", error)
        rows -= set(unreferenced)
        files -= set(unreferenced)
        unreferenced = []
    stray = (files - rows) | set(unreferenced)
    if stray and block_records.created:
        await _set_aside(store, sorted(stray))
    elif stray:
        await asyncio.to_thread(_delete_all, store, sorted(stray))
    missing = await block_records.blocks(sorted(rows - files - set(unreferenced)))
    if shared:
        missing = {}  # the shared tier may hold them: a restore tries it, else misses
    for key in [k for k, record in missing.items() if not record.quarantined]:
        await block_records.quarantine_block(key)
        stats.corrupt_blocks += 1
        log.warning("block %s has a row but no file; quarantined", key[:16])
    if temporaries or stray:
        log.info(
            "recovery: removed %d temporary and %d unreferenced block files",
            temporaries,
            len(stray),
        )


async def _set_aside(store: BlockStore, keys: list[str]) -> None:
    """Block files beside a database created just now: it was deleted or replaced (by
    hand, say), and the files are not leftovers a crash left. They are moved into
    quarantine rather than deleted, so a mistake with the database does not destroy
    the cache. (Files a known database no longer references are deleted: their agents
    were, and a deleted tenant's KV must not linger.)"""
    await asyncio.to_thread(_quarantine_all, store, keys)
    log.warning(
        "the database is new, but %d block files were there (was it deleted or replaced?): "
        "moved into quarantine, not deleted",
        len(keys),
    )


def _quarantine_all(store: BlockStore, keys: list[str]) -> None:
    for key in keys:
        store.quarantine(key)


def _delete_all(store: BlockStore, keys: list[str]) -> None:
    for key in keys:
        store.delete(key)
