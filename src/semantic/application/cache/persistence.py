"""Write-behind persistence: block files first, then the metadata that points at them.

One asyncio task takes save jobs in order. For each it writes only the blocks the metadata
does not know yet (a turn writes its new blocks and its partial tail, never the whole
conversation), off the event loop, durably; only then does one transaction record the
blocks and the agent's new block list. Files of blocks no agent references any more are
deleted after that commit. A crash at any point leaves either the old list or the new one,
and never a row pointing at a missing file (ADR 0006).
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from semantic.application.cache.hot_index import HotBlock, HotIndex
from semantic.application.cache.lineage import Lineage, branch_id, lineage
from semantic.application.cache.stats import CacheStats
from semantic.ports.block_store import BlockStore
from semantic.ports.metadata_store import AgentRecord, BlockRecord, MetadataStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SaveJob:
    request_id: str
    namespace: str
    agent_id: str
    anonymous: bool
    chain: list[HotBlock]
    token_count: int


class Saver:
    def __init__(
        self,
        store: BlockStore,
        metadata: MetadataStore,
        hot: HotIndex,
        stats: CacheStats,
        *,
        disk_quota_bytes: int | None,
        disk_reserve_bytes: int = 0,
    ) -> None:
        self._store = store
        self._metadata = metadata
        self._hot = hot
        self._stats = stats
        self._quota = disk_quota_bytes
        self._reserve = disk_reserve_bytes
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[SaveJob] | None = None
        self._task: asyncio.Task[None] | None = None
        self._pending: dict[str, asyncio.Future[None]] = {}

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        await self.recover()
        self._loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue()
        self._task = asyncio.create_task(self._run(), name="semantic-saver")

    def submit(self, job: SaveJob) -> None:
        """Queue a save; safe from any thread."""
        if self._loop is None:
            raise RuntimeError("Saver.start() was not awaited")
        self._loop.call_soon_threadsafe(self._enqueue, job)

    async def saved(self, request_id: str) -> None:
        """Wait until the save queued for ``request_id`` (if any) has committed."""
        future = self._pending.get(request_id)
        if future is not None:
            await asyncio.shield(future)

    def _enqueue(self, job: SaveJob) -> None:
        if self._queue is None or self._loop is None:
            return
        self._pending[job.request_id] = self._loop.create_future()
        self._queue.put_nowait(job)

    async def flush(self) -> None:
        if self._queue is not None:
            await asyncio.sleep(0)  # let saves submitted from other threads land first
            await self._queue.join()

    async def close(self) -> None:
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def recover(self) -> None:
        """At start: remove half-written files, files no row knows and rows no one uses;
        quarantine rows whose file is gone (they point nowhere)."""
        temporaries = await asyncio.to_thread(self._store.remove_temporaries)
        files = await asyncio.to_thread(self._store.keys)
        rows = await self._metadata.all_block_keys()
        unreferenced = await self._metadata.unreferenced_blocks()
        await self._metadata.delete_blocks(unreferenced)
        stray = (files - rows) | set(unreferenced)
        if stray and self._metadata.created:
            await self._set_aside(sorted(stray))
        else:
            await self.delete_files(sorted(stray))
        missing = await self._metadata.blocks(sorted(rows - files - set(unreferenced)))
        for key in [k for k, record in missing.items() if not record.quarantined]:
            await self._metadata.quarantine_block(key)
            self._stats.corrupt_blocks += 1
            log.warning("block %s has a row but no file; quarantined", key[:16])
        if temporaries or stray:
            log.info(
                "recovery: removed %d temporary and %d unreferenced block files",
                temporaries,
                len(stray),
            )

    async def _set_aside(self, keys: list[str]) -> None:
        """Block files beside a database created just now: it was deleted or replaced (by
        hand, say), and the files are not leftovers a crash left. They are moved into
        quarantine rather than deleted, so a mistake with the database does not destroy
        the cache. (Files a known database no longer references are deleted: their agents
        were, and a deleted tenant's KV must not linger.)"""
        await asyncio.to_thread(self._quarantine_all, keys)
        log.warning(
            "the database is new, but %d block files were there (was it deleted or replaced?): "
            "moved into quarantine, not deleted",
            len(keys),
        )

    async def delete_files(self, keys: Sequence[str]) -> None:
        if keys:
            await asyncio.to_thread(self._delete_all, list(keys))

    def _quarantine_all(self, keys: list[str]) -> None:
        for key in keys:
            self._store.quarantine(key)

    def _delete_all(self, keys: list[str]) -> None:
        for key in keys:
            self._store.delete(key)

    async def _run(self) -> None:
        queue = self._queue
        if queue is None:
            return
        while True:
            job = await queue.get()
            try:
                await self._save(job)
            except Exception:
                self._stats.saves_failed += 1
                self._hot.mark_save_failed(block.key for block in job.chain)
                log.exception(
                    "saving %s/%s failed; its KV stays in memory only, until memory is needed",
                    job.namespace,
                    job.agent_id,
                )
            finally:
                self._acknowledge(job.request_id)
                queue.task_done()

    def _acknowledge(self, request_id: str) -> None:
        future = self._pending.pop(request_id, None)
        if future is not None and not future.done():
            future.set_result(None)

    async def _save(self, job: SaveJob) -> None:
        keys = [block.key for block in job.chain]
        known = await self._metadata.blocks(keys)
        todo = [b for b in job.chain if b.key not in known or known[b.key].quarantined]
        started = time.perf_counter()
        try:
            records = await asyncio.to_thread(self._write, job.namespace, todo)
        except OSError as error:
            if error.errno == errno.ENOSPC:  # room for the next save, if not for this one
                await self._enforce_quota(job.namespace, job.agent_id)
            raise
        self._stats.write_seconds += time.perf_counter() - started
        self._stats.blocks_written += len(records)
        self._stats.bytes_written += sum(r.nbytes for r in records)
        stored = await lineage(self._metadata, job.namespace, job.chain)
        agent_id = stored.conversation_id() if job.anonymous else job.agent_id
        if not job.anonymous:
            await self._keep_branch(job.namespace, agent_id, stored)
        agent = AgentRecord(
            job.namespace, agent_id, tuple(keys), job.token_count, anonymous=job.anonymous
        )
        orphans = await self._metadata.save_agent_blocks(agent, records)
        self._hot.mark_persisted(keys)
        self._acknowledge(job.request_id)  # the reply need not wait for the cleanup below
        for branch in stored.covered_branches(agent_id):  # none for a conversation's id
            orphans += await self._metadata.delete_agent(job.namespace, branch.agent_id)
        self._hot.remove(orphans)  # superseded: kept, a deleted agent's KV would linger
        await self.delete_files(orphans)
        await self._enforce_quota(job.namespace, agent_id)

    async def _keep_branch(self, namespace: str, agent_id: str, stored: Lineage) -> None:
        """An agent whose new turn does not extend its stored one keeps the old block list
        as a branch record, committed before the new list can orphan its blocks."""
        old = await self._metadata.agent(namespace, agent_id)
        if old is None or stored.extends(old):
            return
        branch = dataclasses.replace(
            old, agent_id=branch_id(old), system_prompt=None, anonymous=True
        )
        await self._metadata.save_agent_blocks(branch, [])

    def _write(self, namespace: str, blocks: list[HotBlock]) -> list[BlockRecord]:
        records = []
        for block in blocks:
            stored = self._store.save(block.key, block.present)
            records.append(
                BlockRecord(
                    block.key, block.parent, namespace, block.tokens, stored.nbytes, stored.checksum
                )
            )
        return records

    async def _enforce_quota(self, namespace: str, agent_id: str) -> None:
        """Over the disk quota, or short of the free space to keep: drop the least recently
        used records' blocks, oldest first, keeping only what a record left whole still
        uses, then, if the quota still does not hold, the end of the agent just saved,
        which keeps its prefix: the quota is a cap, not a target (the files kept to be
        written over, ``SPARES`` of them, are outside it). A block shared by old records
        alone (an agent and its branch, conversations with one system prompt) goes with
        them. The reserve never cuts the agent just saved: a disk another program fills
        would otherwise leave no agent anything cached, not even in memory."""
        limit = await self._limit()
        if limit is None or await self._metadata.total_block_bytes() <= limit:
            return
        everyone = await self._metadata.agents()
        newest = next(
            (a for a in everyone if (a.namespace, a.agent_id) == (namespace, agent_id)), None
        )
        older = sorted((a for a in everyone if a is not newest), key=lambda a: a.last_used)
        last_user = {
            key: rank
            for rank, a in enumerate([*older, *([newest] if newest else [])])
            for key in a.block_keys
        }
        cut = await self._records_to_cut(older, last_user, limit)
        for agent in older[:cut]:
            await self._cut(agent, [k for k in agent.block_keys if last_user[k] >= cut])
        over = await self._metadata.total_block_bytes() > limit
        if over and newest is not None and self._quota is not None:
            await self._cut_end(newest, self._quota)

    async def _records_to_cut(
        self, older: list[AgentRecord], last_user: dict[str, int], limit: int
    ) -> int:
        """How many of the oldest records to cut to be within ``limit``: a block is freed
        once every record using it is cut (all of them, if that is not enough)."""
        excess = await self._metadata.total_block_bytes() - limit
        for rank, agent in enumerate(older):
            rows = await self._metadata.blocks(agent.block_keys)
            excess -= sum(
                rows[k].nbytes for k in set(agent.block_keys) if k in rows and last_user[k] == rank
            )
            if excess <= 0:
                return rank + 1
        return len(older)

    async def _limit(self) -> int | None:
        """The bytes block files may take now: the quota, and no more than leaves the
        reserve free on the disk (so transcripts and the database can still be written
        when something else fills it); None when neither applies."""
        free = self._store.free_bytes() if self._reserve > 0 else None
        if free is None or free >= self._reserve:
            return self._quota
        room = await self._metadata.total_block_bytes() - (self._reserve - free)
        return max(0, room if self._quota is None else min(self._quota, room))

    async def _cut_end(self, agent: AgentRecord, quota: int) -> None:
        """Drop the agent's unshared blocks from its end until the quota holds."""
        records = await self._metadata.blocks(agent.block_keys)
        excess = await self._metadata.total_block_bytes() - quota
        keep = list(agent.block_keys)
        while keep and excess > 0 and keep[-1] in records and records[keep[-1]].ref_count <= 1:
            excess -= records[keep.pop()].nbytes
        await self._cut(agent, keep)

    async def _cut(self, agent: AgentRecord, keep: Sequence[str]) -> None:
        """Keep only the agent's first blocks while they are in ``keep``."""
        records, wanted = await self._metadata.blocks(agent.block_keys), set(keep)
        kept = list(itertools.takewhile(lambda k: k in wanted and k in records, agent.block_keys))
        if len(kept) == len(agent.block_keys):
            return
        if kept or not agent.anonymous:
            tokens = sum(records[k].n_tokens for k in kept)
            shorter = dataclasses.replace(agent, block_keys=tuple(kept), token_count=tokens)
            orphans = await self._metadata.save_agent_blocks(shorter, [], create=False)
        else:  # a conversation or branch with nothing left is nothing
            orphans = await self._metadata.delete_agent(agent.namespace, agent.agent_id)
        self._hot.remove(orphans)
        await self.delete_files(orphans)
