"""The shared block tier beside an instance's own memory and disk (ADR 0022).

After a save commits, its new blocks are pushed to the shared tier by one background task,
off the request path, from their files (the exact bytes whose checksum the metadata holds);
only once the tier has a block does its row say so (``mark_blocks_shared``). A restore that
finds a block's row but no file on this instance's disk (another instance wrote it) reads
it from the tier, keeps it as its own file, then reads it as any other. A block the tier
lacks is a miss: the restore stops before it and the prompt is computed from there. A copy
whose checksum fails is deleted from the tier, counted and missed. The tier is a cache: an
unreachable one costs hits, never a request. A namespace with a quota there
(``shared_mb``) is trimmed after each push of its blocks, its least recently used first;
another namespace's blocks are never touched (ADR 0028).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from semantic.application.cache.stats import CacheStats
from semantic.domain.errors import CacheCorruptionError
from semantic.domain.quotas import NamespaceQuotas
from semantic.ports.block_store import BlockStore, LayerPayload
from semantic.ports.metadata_store import BlockRecord, BlockRecords
from semantic.ports.shared_blocks import SharedBlock, SharedBlocks, SharedHead, SharedUsage

log = logging.getLogger(__name__)

QUEUE_JOBS = 64
"""Saves waiting to be pushed; beyond it a save's blocks are not shared (counted)."""
PROBE_S = 1.0
"""While the tier is unreachable and nothing is to be pushed, it is tried this often, so
``/health`` sees it come back."""
CLOSE_S = 10.0
"""At shutdown, how long pushes still queued may take before they are given up."""


@dataclass(frozen=True)
class _Publish:
    namespace: str
    records: list[BlockRecord]


@dataclass(frozen=True)
class _Discard:
    keys: list[str]


class SharedTier:
    def __init__(
        self,
        blocks: SharedBlocks,
        store: BlockStore,
        block_records: BlockRecords,
        stats: CacheStats,
        fingerprint: str,
        *,
        quotas: NamespaceQuotas | None = None,
        queue_jobs: int = QUEUE_JOBS,
        probe_s: float = PROBE_S,
    ) -> None:
        self._blocks = blocks
        self._store = store
        self._block_records = block_records
        self._stats = stats
        self._fingerprint = fingerprint
        self._quotas = quotas or NamespaceQuotas()
        self._queue_jobs = queue_jobs
        self._probe_s = probe_s
        self._queue: asyncio.Queue[_Publish | _Discard] | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def state(self) -> str:
        """``ok``, or ``unreachable`` since the last exchange failed."""
        return "ok" if self._blocks.reachable else "unreachable"

    async def start(self) -> None:
        if not await asyncio.to_thread(self._blocks.probe):
            log.warning("the shared block tier is unreachable at start; serving without it")
        self._queue = asyncio.Queue(self._queue_jobs)
        self._task = asyncio.create_task(self._run(), name="semantic-shared-tier")

    async def close(self) -> None:
        """Push what is queued (for at most ``CLOSE_S``), then stop."""
        if self._queue is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue.join(), CLOSE_S)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await asyncio.to_thread(self._blocks.close)

    async def usage(self) -> SharedUsage | None:
        """What the tier holds (every instance's blocks), None while unreachable."""
        return await asyncio.to_thread(self._blocks.usage)

    async def held(self, namespace: str) -> int | None:
        """Bytes the tier holds for ``namespace`` (None while unreachable)."""
        return await asyncio.to_thread(self._blocks.held, namespace)

    async def flush(self) -> None:
        """Wait until every queued push and discard has been tried."""
        if self._queue is not None:
            await self._queue.join()

    def publish(self, namespace: str, records: Sequence[BlockRecord]) -> None:
        """Queue committed blocks to be pushed (event loop; never waits). Dropped, and
        counted, when the queue is full or the tier unreachable."""
        if not records:
            return
        if self._queue is None or not self._blocks.reachable:
            self._stats.shared_dropped += len(records)
            return
        try:
            self._queue.put_nowait(_Publish(namespace, list(records)))
        except asyncio.QueueFull:
            self._stats.shared_dropped += len(records)

    def discard(self, keys: Sequence[str]) -> None:
        """Queue the removal of blocks no record uses any more (a deleted agent's KV must
        not linger in the tier either)."""
        if keys and self._queue is not None:
            with contextlib.suppress(asyncio.QueueFull):  # Redis's eviction takes them later
                self._queue.put_nowait(_Discard(list(keys)))

    def fetch(self, record: BlockRecord) -> list[LayerPayload] | None:
        """A block this instance's disk lacks, read from the tier (a reader thread); None
        for a miss: not there, unreachable, another file of it, or corrupt. Not written to
        disk here: the request's save writes every block of its chain this disk lacks,
        after the reply, as any other (``Saver``), so a restore waits on no fsync."""
        shared = self._blocks.get(record.key)
        if (
            shared is None
            or not self._belongs(shared.head, record.namespace)
            or shared.head.checksum != record.checksum  # another file of it: this one is kept
        ):
            self._stats.shared_misses += 1
            return None
        try:
            payloads = self._store.load_bytes(record.key, shared.data, shared.head.checksum)
        except CacheCorruptionError as error:
            log.warning("shared block %s is corrupt (%s); discarded", record.key[:16], error)
            self._blocks.discard([record.key])
            self._stats.shared_corrupt += 1
            self._stats.shared_misses += 1
            return None
        self._stats.shared_fetched += 1
        return payloads

    async def records(self, namespace: str, keys: Sequence[str]) -> dict[str, BlockRecord]:
        """Rows for blocks the tier holds that this instance's metadata does not know (a
        prompt another instance answered): enough to restore them, tokens compared."""
        heads = await asyncio.to_thread(self._blocks.heads, keys)
        return {
            key: BlockRecord(key, h.parent_key, namespace, h.tokens, 0, h.checksum)
            for key, h in heads.items()
            if self._belongs(h, namespace)
        }

    def _belongs(self, head: SharedHead, namespace: str) -> bool:
        """The key already encodes both; checked again, as the tokens are."""
        return head.namespace == namespace and head.fingerprint == self._fingerprint

    async def _run(self) -> None:
        queue = self._queue
        if queue is None:
            return
        while True:
            try:
                job = await asyncio.wait_for(queue.get(), self._probe_s)
            except TimeoutError:
                if not self._blocks.reachable:
                    await asyncio.to_thread(self._blocks.probe)
                continue
            try:
                if isinstance(job, _Discard):
                    await asyncio.to_thread(self._blocks.discard, job.keys)
                else:
                    pushed = await asyncio.to_thread(self._push, job)
                    if pushed:
                        await self._block_records.mark_blocks_shared(pushed)
                    await asyncio.to_thread(self._trim, job.namespace)
            except Exception as error:  # noqa: BLE001 - the tier is a cache: log, go on
                log.warning("the shared block tier: %s", error)
            finally:
                queue.task_done()

    def _trim(self, namespace: str) -> None:
        """The namespace within its quota in the tier, if it has one there."""
        limit = self._quotas.of(namespace).shared_bytes
        if limit is not None:
            self._stats.shared_trimmed += len(self._blocks.trim(namespace, limit))

    def _push(self, job: _Publish) -> list[str]:
        """Each block's file, as it is on disk now (collected since, it is skipped)."""
        pushed = []
        for record in job.records:
            data = self._store.file_bytes(record.key, record.checksum)
            if data is None:
                continue
            head = SharedHead(
                record.key,
                record.parent_key,
                job.namespace,
                self._fingerprint,
                record.tokens,
                record.checksum,
            )
            if self._blocks.put(SharedBlock(head, data)):
                pushed.append(record.key)
                self._stats.shared_published += 1
            else:
                self._stats.shared_dropped += 1
        return pushed
