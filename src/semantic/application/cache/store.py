"""AgentCacheStore: find the longest stored prefix of a prompt, and keep what requests leave.

Lookups walk the prompt's block ids (memory first, then disk), then reuse the stored block
that shares the longest token prefix with the rest, even if it ends mid-block. Completed
requests hand their blocks over on the engine thread (no I/O there); a single writer task
saves new blocks to disk and commits the metadata after the files are durable.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from semantic.application.cache.adoption import Adoption, LeaseOf
from semantic.application.cache.chain import ChainPinner
from semantic.application.cache.disk_room import DISK_FLOOR_BYTES, DiskRoom, DiskState
from semantic.application.cache.eviction_policy import (
    AgentRecordOrder,
    RecordOrder,
    agent_order,
    lru_order,
    lru_records,
)
from semantic.application.cache.hot_index import HotIndex
from semantic.application.cache.loader import BlockLoader
from semantic.application.cache.lookup import CachedPrefix, PrefixLookup
from semantic.application.cache.persistence import Saver
from semantic.application.cache.prefix_walk import PrefixWalk
from semantic.application.cache.retention_book import RetentionBook
from semantic.application.cache.shared_tier import SharedTier
from semantic.application.cache.stats import CacheStats
from semantic.application.cache.stored_plan import StoredPlan
from semantic.application.cache.tool_waits import ToolWaits
from semantic.application.engine.events import CompletionEvent
from semantic.domain.block_pool import BlockPool
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.quotas import NamespaceQuotas, Quota
from semantic.ports.block_store import BlockStore
from semantic.ports.metadata_store import AgentRecords, BlockRecords
from semantic.ports.shared_blocks import SharedBlocks, SharedUsage

__all__ = ["AgentCacheStore", "CacheConfig", "CachedPrefix", "LeaseOf"]

T = TypeVar("T")


@dataclass(frozen=True)
class CacheConfig:
    disk_quota_bytes: int | None = None
    disk_reserve_bytes: int = 0
    """Free space to keep on the data directory's disk: blocks are dropped, least recently
    used first, when less is left."""
    eviction: str = "agent"
    """Which hot blocks go first when memory is short: ``agent`` (retention hints, then
    least recently used) or ``lru`` (hints ignored: the baseline)."""
    quotas: NamespaceQuotas = field(default_factory=NamespaceQuotas)
    """Each namespace's hard limits (``--namespace-quotas``): memory and disk."""
    expire_every_s: float = 0.5
    """How often blocks past their TTL are moved to disk."""
    disk_floor_bytes: int = DISK_FLOOR_BYTES
    """Free space below which no block file is written, and a transcript write takes even
    its own agent's blocks: the database's room (``disk_room``)."""


@dataclass(frozen=True, slots=True)
class NamespaceUsage:
    memory_bytes: int
    disk_bytes: int
    quota: Quota
    shared_bytes: int | None = None
    """What the shared tier holds for it (None: no tier, or unreachable)."""


class AgentCacheStore:
    """The cache's one face to the rest of the application: each job is its own module
    (``lookup``, ``adoption``, ``persistence``, ``disk_room``, ``shared_tier``), built and
    wired here so callers hold one object."""

    def __init__(
        self,
        pool: BlockPool,
        spec: ModelCacheSpec,
        fingerprint: str,
        *,
        block_store: BlockStore,
        agent_records: AgentRecords,
        block_records: BlockRecords,
        config: CacheConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        lease_of: LeaseOf | None = None,
        shared: SharedBlocks | None = None,
    ) -> None:
        self._pool = pool
        self._spec = spec
        self._block_records = block_records
        self._config = config or CacheConfig()
        self.stats = CacheStats()
        lru = self._config.eviction == "lru"
        self.hot = HotIndex(pool, clock, lru_order if lru else agent_order)
        self.retention = RetentionBook(clock)
        """Agents' retention hints, as adoption gives them to their blocks."""
        self.tool_waits = ToolWaits(clock)
        """How long each agent's tools take: its KV is held that long after it calls them."""
        self._expiring: asyncio.Task[None] | None = None
        self._shared = self._shared_over(shared, block_store, block_records, fingerprint)
        records: RecordOrder = lru_records if lru else AgentRecordOrder(self.tool_waits)
        self._room = self._room_over(block_store, agent_records, block_records, records)
        self._saver = self._saver_over(block_store, agent_records, block_records)
        self._walk = PrefixWalk(spec, fingerprint, block_records, self.hot, self._shared)
        self._lookup = self._lookup_over(block_store)
        self._adoption = Adoption(
            pool,
            spec,
            self.hot,
            self._saver,
            root=self._walk.root,
            lease_of=lease_of,
            retention=self.retention,
        )
        self._fingerprint = fingerprint

    def _shared_over(
        self,
        shared: SharedBlocks | None,
        block_store: BlockStore,
        block_records: BlockRecords,
        fingerprint: str,
    ) -> SharedTier | None:
        """The shared tier (None: none configured), held to the namespaces' quotas there."""
        if shared is None:
            return None
        quotas = self._config.quotas
        return SharedTier(
            shared, block_store, block_records, self.stats, fingerprint, quotas=quotas
        )

    def _room_over(
        self,
        block_store: BlockStore,
        agent_records: AgentRecords,
        block_records: BlockRecords,
        order: RecordOrder,
    ) -> DiskRoom:
        """The disk's keeper, held to the configured quota, reserve and floor, cutting
        agents in ``order`` (the eviction policy's, as memory's)."""
        config = self._config
        books = (block_store, agent_records, block_records, self.hot, self.stats)
        return DiskRoom(
            *books,
            quota=config.disk_quota_bytes,
            reserve=config.disk_reserve_bytes,
            floor=config.disk_floor_bytes,
            quotas=config.quotas,
            order=order,
        )

    def _saver_over(
        self, block_store: BlockStore, agent_records: AgentRecords, block_records: BlockRecords
    ) -> Saver:
        """The writer, making room on the disk (``_room``) and publishing to the shared tier."""
        return Saver(
            block_store,
            agent_records,
            block_records,
            self.hot,
            self.stats,
            room=self._room,
            shared=self._shared,
        )

    def _lookup_over(self, block_store: BlockStore) -> PrefixLookup:
        """The prefix lookup and the loader it restores with (memory pressure there goes
        through ``reclaim``, as the engine's does)."""
        loader = BlockLoader(
            self._pool,
            self._spec,
            block_store,
            block_records=self._block_records,
            hot=self.hot,
            stats=self.stats,
            shared=self._shared,
            reclaim=self.reclaim,
        )
        pinner = ChainPinner(self._pool, self._spec, self.hot, loader)
        plan = StoredPlan(self._spec, self.hot, loader, pinner, self.stats)
        return PrefixLookup(
            self._pool, self.stats, loader, walk=self._walk, pinner=pinner, plan=plan
        )

    def hold_for_tools(
        self, namespace: str, agent_id: str, tools: Sequence[str], keys: Sequence[str]
    ) -> None:
        """A reply called ``tools``: the agent's blocks stay in memory before others' for as
        long as those tools have taken it (``ToolWaits``), so the turn that brings their
        results starts from memory."""
        self.hot.hold(keys, self.tool_waits.started(namespace, agent_id, tools))

    async def start(self) -> None:
        """Clean up after a crash, hold the disk's quotas as they are now set, then start
        the writer (and the shared tier's pusher)."""
        await self._saver.start()
        await self._room.settle()
        if self._shared is not None:
            await self._shared.start()
        self._expiring = asyncio.create_task(self._expire(), name="semantic-ttl-expiry")

    async def close(self) -> None:
        """Flush every pending save, then stop the writer."""
        if self._expiring is not None:
            self._expiring.cancel()
            await asyncio.gather(self._expiring, return_exceptions=True)
        await self._saver.close()
        if self._shared is not None:
            await self._shared.close()
        self._lookup.shutdown()

    async def flush(self) -> None:
        await self._saver.flush()

    async def _expire(self) -> None:
        """Blocks past their TTL go to disk, a sweep every ``expire_every_s``."""
        while True:
            await asyncio.sleep(self._config.expire_every_s)
            gone = self.hot.expire()
            if gone:
                self.stats.blocks_expired += gone
            self._trim_namespaces()

    def _trim_namespaces(self) -> int:
        """Each namespace over its memory quota gives up its own blocks; how many pool
        blocks went."""
        freed = 0
        for namespace, quota in self._config.quotas.limited().items():
            if quota.memory_bytes is not None:
                freed += self.hot.trim(namespace, quota.memory_bytes // self._spec.block_bytes)
        return freed

    async def flush_shared(self) -> None:
        """Wait until every committed block queued for the shared tier has been tried."""
        await self.flush()
        if self._shared is not None:
            await self._shared.flush()

    @property
    def shared_state(self) -> str | None:
        """The shared block tier: ``ok``, ``unreachable``, or None when there is none."""
        return None if self._shared is None else self._shared.state

    async def shared_usage(self) -> SharedUsage | None:
        """What the shared block tier holds; None without one or while it is unreachable."""
        return None if self._shared is None else await self._shared.usage()

    async def namespace_usage(self, namespace: str) -> NamespaceUsage:
        """What the namespace's KV takes of memory, disk and the shared tier, beside its
        quota."""
        held = self.hot.pool_blocks_by_namespace().get(namespace, 0)
        on_disk = await self._block_records.block_bytes_by_namespace()
        quota = self._config.quotas.of(namespace)
        shared = None if self._shared is None else await self._shared.held(namespace)
        memory = held * self._spec.block_bytes
        return NamespaceUsage(memory, on_disk.get(namespace, 0), quota, shared)

    async def disk_by_namespace(self) -> dict[str, int]:
        """Bytes of block files each namespace's records hold (the metrics read it)."""
        return await self._block_records.block_bytes_by_namespace()

    def memory_by_namespace(self) -> dict[str, int]:
        """Bytes of memory each namespace's cached KV holds (the metrics read it)."""
        held = self.hot.pool_blocks_by_namespace()
        return {namespace: n * self._spec.block_bytes for namespace, n in held.items()}

    @property
    def quotas(self) -> NamespaceQuotas:
        return self._config.quotas

    @property
    def disk(self) -> DiskState:
        """Free space on the data directory's disk, and whether writes are being refused."""
        return self._room.state

    def check_room(self) -> None:
        """Raises ``DiskFullError`` while the disk is as full as when a write was last
        refused: a turn that could not be kept is refused before its reply is computed."""
        self._room.check()

    async def keeping(self, namespace: str, agent_id: str, write: Callable[[], Awaitable[T]]) -> T:
        """A metadata write with room made for it on the disk, cached KV giving way first
        (``DiskRoom.keeping``); raises ``DiskFullError`` when nothing of ours is left."""
        return await self._room.keeping(namespace, agent_id, write)

    @property
    def block_bytes(self) -> int:
        """One layer's block in the pool (a block in memory holds one per layer it keeps)."""
        return self._spec.block_bytes

    @property
    def fingerprint(self) -> str:
        """The model fingerprint block keys are rooted in (ADR 0005)."""
        return self._fingerprint

    def root(self, namespace: str) -> str:
        """The key a namespace's chains hang from (ADR 0005)."""
        return self._walk.root(namespace)

    async def prepare(self, namespace: str, prompt: Sequence[int]) -> CachedPrefix:
        """Pin the longest stored prefix of ``prompt`` (loading disk blocks into memory)."""
        return await self._lookup.prepare(namespace, prompt)

    def release(self, prefix: CachedPrefix) -> None:
        self._pool.release_owner(prefix.pin)

    def demote(self, keys: Sequence[str]) -> int:
        """Leave ``keys`` on disk only: their memory goes back to the pool now (an agent
        that will not be back soon); blocks not yet saved, or in use, stay. How many went."""
        return self.hot.demote(keys)

    async def prefetch(self, namespace: str, tokens: Sequence[int]) -> tuple[int, int]:
        """Load the stored prefix of ``tokens`` into memory ahead of its turn, as a
        request's restore would (the pool's least recently used blocks safe on disk make
        room), and leave it there unpinned; the tokens that were in memory already and
        those loaded from disk or the shared tier."""
        prefix = await self.prepare(namespace, tokens)
        self.release(prefix)
        return prefix.hot_tokens, prefix.disk_tokens

    def adopt_completion(self, event: CompletionEvent) -> None:
        """``adopt`` under the agent the completion names (the engine loop's
        ``on_completion``)."""
        self.adopt(event, event.agent_id)

    def adopt(self, event: CompletionEvent, agent_id: str) -> None:
        """Keep a finished request's blocks (engine thread; no I/O) and queue their save."""
        self._adoption.adopt(event, agent_id)

    async def saved(self, request_id: str) -> None:
        """Wait until what ``request_id`` left behind is on disk (returns at once if nothing
        was saved for it)."""
        await self._saver.saved(request_id)

    def reclaim(self, n_pool_blocks: int) -> int:
        """Memory pressure: evict idle hot blocks that are safe on disk, a namespace over
        its memory quota its own first (a tenant over quota must not cost another its
        memory while the sweep has yet to trim it)."""
        freed = self._trim_namespaces()
        return freed + self.hot.evict(max(0, n_pool_blocks - freed))

    async def forget(self, keys: Sequence[str]) -> None:
        """Drop deleted blocks from memory and disk."""
        self.hot.remove(keys)
        await self._saver.delete_files(keys)
        if self._shared is not None:
            self._shared.discard(keys)
