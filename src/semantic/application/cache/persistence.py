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
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from semantic.application.cache.disk_room import DiskRoom
from semantic.application.cache.hot_index import HotBlock, HotIndex
from semantic.application.cache.lineage import Lineage, branch_id, lineage
from semantic.application.cache.recovery import recover
from semantic.application.cache.shared_tier import SharedTier
from semantic.application.cache.stats import CacheStats
from semantic.domain.errors import DiskFullError, LeaseLostError
from semantic.ports.block_store import BlockStore
from semantic.ports.leases import Lease
from semantic.ports.metadata_store import AgentRecord, AgentRecords, BlockRecord, BlockRecords

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SaveJob:
    request_id: str
    namespace: str
    agent_id: str
    anonymous: bool
    chain: list[HotBlock]
    token_count: int
    lease: Lease | None = None
    """The lease the agent's turn held when it finished: its chain is saved under it, and
    refused, keeping nothing, once another instance took the agent (ADR 0025)."""


class Saver:
    def __init__(
        self,
        store: BlockStore,
        agent_records: AgentRecords,
        block_records: BlockRecords,
        hot: HotIndex,
        stats: CacheStats,
        *,
        room: DiskRoom,
        shared: SharedTier | None = None,
    ) -> None:
        self._store = store
        self._shared = shared
        self._agent_records = agent_records
        self._block_records = block_records
        self._hot = hot
        self._stats = stats
        self._room = room
        self._bytes_per_token = 0.0
        """The most a block file took per token so far: what the next one will need."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[SaveJob] | None = None
        self._task: asyncio.Task[None] | None = None
        self._pending: dict[str, asyncio.Future[None]] = {}

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        await self.recover()
        await asyncio.to_thread(self._room.keep_headroom)
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
        """At start: the files and the metadata in agreement again (``recovery``)."""
        await recover(
            self._store, self._block_records, self._stats, shared=self._shared is not None
        )

    async def delete_files(self, keys: Sequence[str]) -> None:
        if keys:
            await asyncio.to_thread(self._delete_all, list(keys))

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
            except Exception as error:
                self._stats.saves_failed += 1
                self._hot.mark_save_failed(block.key for block in job.chain)
                full = (
                    isinstance(error, DiskFullError | LeaseLostError)
                    or getattr(error, "errno", 0) == errno.ENOSPC
                )
                log.log(
                    logging.WARNING if full else logging.ERROR,
                    "saving %s/%s failed (%s); its KV stays in memory only, until memory is needed",
                    job.namespace,
                    job.agent_id,
                    error,
                    exc_info=not full,
                )
            finally:
                self._acknowledge(job.request_id)
                queue.task_done()

    def _acknowledge(self, request_id: str) -> None:
        future = self._pending.pop(request_id, None)
        if future is not None and not future.done():
            future.set_result(None)

    async def _save(self, job: SaveJob) -> None:
        """Under the room's lock, so no pass a transcript write starts cuts blocks this
        save is about to list. Files written for a save that fails go at once."""
        async with self._room.lock:
            written: list[str] = []
            try:
                await self._save_locked(job, written)
            except BaseException:
                await self.delete_files(written)  # no row knows them: they are nothing
                raise

    async def _save_locked(self, job: SaveJob, written: list[str]) -> None:
        keys = [block.key for block in job.chain]
        known = await self._block_records.blocks(keys)
        absent = await self._absent([k for k, r in known.items() if not r.quarantined])
        todo = [
            b
            for b in job.chain
            if b.key not in known or known[b.key].quarantined or b.key in absent
        ]
        try:
            records = await self._write(job, todo, written)
        except OSError as error:
            if error.errno == errno.ENOSPC:  # room for the next save, if not for this one
                await self._room.enforce(job.namespace, job.agent_id, chain=keys, hard=True)
            raise
        stored = await lineage(self._agent_records, self._block_records, job.namespace, job.chain)
        agent_id = stored.conversation_id() if job.anonymous else job.agent_id
        lease = None if job.anonymous else job.lease
        if not job.anonymous:
            await self._keep_branch(job.namespace, agent_id, stored, lease)
        agent = AgentRecord(
            job.namespace, agent_id, tuple(keys), job.token_count, anonymous=job.anonymous
        )
        try:
            orphans = await self._agent_records.save_agent_blocks(agent, records, lease=lease)
        except DiskFullError:
            await self._room.after_full(job.namespace, agent_id, chain=keys)
            orphans = await self._agent_records.save_agent_blocks(agent, records, lease=lease)
        written.clear()  # recorded: theirs to keep
        self._hot.mark_persisted(keys)
        self._acknowledge(job.request_id)  # the reply need not wait for the cleanup below
        if self._shared is not None:  # committed: now other instances may have them
            self._shared.publish(job.namespace, records)
        for branch in stored.covered_branches(agent_id):  # none for a conversation's id
            orphans += await self._agent_records.delete_agent(
                job.namespace, branch.agent_id, lease=lease
            )
        self._hot.remove(orphans)  # superseded: kept, a deleted agent's KV would linger
        await self.delete_files(orphans)
        if self._shared is not None:
            self._shared.discard(orphans)
        await self._room.enforce(job.namespace, agent_id)

    async def _absent(self, keys: list[str]) -> set[str]:
        """Known blocks this disk has no file for: with a shared tier (and a shared
        database), another instance wrote them, and this one keeps its own copy of what it
        computed again."""
        if self._shared is None or not keys:
            return set()
        return await asyncio.to_thread(lambda: {k for k in keys if not self._store.has(k)})

    async def _keep_branch(
        self, namespace: str, agent_id: str, stored: Lineage, lease: Lease | None
    ) -> None:
        """An agent whose new turn does not extend its stored one keeps the old block list
        as a branch record, committed before the new list can orphan its blocks."""
        old = await self._agent_records.agent(namespace, agent_id)
        if old is None or stored.extends(old):
            return
        branch = dataclasses.replace(
            old, agent_id=branch_id(old), system_prompt=None, anonymous=True
        )
        await self._agent_records.save_agent_blocks(branch, [], lease=lease)

    async def _write(
        self, job: SaveJob, blocks: list[HotBlock], written: list[str]
    ) -> list[BlockRecord]:
        """Each block's file, once the room allows it (else ``ENOSPC``: the disk is kept
        for transcripts); ``written`` names each file as it lands."""
        started = time.perf_counter()
        keys = [block.key for block in job.chain]
        records = []
        for block in blocks:
            need = round(self._bytes_per_token * len(block.tokens))
            if not await self._room.for_block(job.namespace, job.agent_id, keys, need):
                raise OSError(errno.ENOSPC, "no room for block files above the disk's floor")
            stored = await asyncio.to_thread(self._store.save, block.key, block.present)
            written.append(block.key)
            records.append(
                BlockRecord(
                    block.key,
                    block.parent,
                    job.namespace,
                    block.tokens,
                    stored.nbytes,
                    stored.checksum,
                )
            )
            per_token = stored.nbytes / max(1, len(block.tokens))
            self._bytes_per_token = max(self._bytes_per_token, per_token)
        self._stats.write_seconds += time.perf_counter() - started
        self._stats.blocks_written += len(records)
        self._stats.bytes_written += sum(r.nbytes for r in records)
        return records
