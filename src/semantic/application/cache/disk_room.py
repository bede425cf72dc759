"""Room on the disk: transcripts first, then cached KV (ADR 0007).

Cached KV is the one thing on the data directory's disk that can be given up without
losing anything a client sent. So before a block file is written, and before the metadata
store is written, least recently used records give up their blocks until the disk keeps
``--disk-reserve-mb`` free (the reserve never cuts the conversation being written: a disk
another program filled would otherwise leave no agent anything cached). Below ``floor``
(room for the database to grow) no block file is written at all, and a metadata write
takes even its own agent's blocks. A metadata write that still finds the disk full
releases the headroom file (room for the transactions that record evictions) and every
block of ours, and tries once more; only then is it refused with ``DiskFullError``. Nothing
here holds state that a full disk leaves behind: the next write that finds room succeeds.

Every pass runs under ``lock``: the writer holds it for a whole save, so a pass started by
a transcript write never cuts blocks a save in flight is about to list.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from semantic.application.cache.eviction_policy import RecordOrder, lru_records
from semantic.application.cache.hot_index import HotIndex
from semantic.application.cache.namespace_room import NamespaceRoom, without_tail
from semantic.application.cache.stats import CacheStats
from semantic.domain.errors import DiskFullError
from semantic.domain.quotas import NamespaceQuotas
from semantic.domain.retention import Retention
from semantic.ports.block_store import BlockStore
from semantic.ports.metadata_store import AgentRecord, AgentRecords, BlockRecords

log = logging.getLogger(__name__)

T = TypeVar("T")

DISK_FLOOR_BYTES = 8 << 20
"""Free space below which no block file is written: room for the database to grow (a
transcript, the write-ahead log, a checkpoint) whatever ``--disk-reserve-mb`` says."""


@dataclass(frozen=True, slots=True)
class DiskState:
    """What ``/health`` and the metrics show: the free bytes (None where unknown) and why
    the last metadata write was refused, while the disk is still that full."""

    free_bytes: int | None
    refused: str | None
    quota_bytes: int | None = None
    """``--disk-quota``: what block files may take at most (None: the disk's free space)."""


class DiskRoom:
    def __init__(
        self,
        store: BlockStore,
        agent_records: AgentRecords,
        block_records: BlockRecords,
        hot: HotIndex,
        stats: CacheStats,
        *,
        quota: int | None,
        reserve: int,
        floor: int,
        quotas: NamespaceQuotas | None = None,
        order: RecordOrder = lru_records,
    ) -> None:
        """``quota``: all block files'; ``quotas``: each namespace's (a save over its
        namespace's cuts that namespace's blocks only); ``order``: whose blocks go first
        (``eviction_policy``)."""
        self._store = store
        self._space = store.space
        self._agent_records = agent_records
        self._block_records = block_records
        self._hot = hot
        self._stats = stats
        self._quota = quota
        self._reserve = reserve
        self._floor = floor
        self._order = order
        self._namespaces = NamespaceRoom(
            agent_records, block_records, quotas or NamespaceQuotas(), self.cut, order
        )
        self.lock = asyncio.Lock()
        self._refused: str | None = None
        self._refused_free = 0
        """Free bytes when a write was last refused: while no more is free, so is the next."""

    @property
    def state(self) -> DiskState:
        free = self._space.free_bytes()
        if self._refused is not None and (free is None or free >= self._floor):
            self._refused = None  # space came back: the next write will find it
        return DiskState(free, self._refused, self._quota)

    def check(self) -> None:
        """Refuse at once what would write nothing but find the disk as full as when the
        last write was refused (no byte freed since), before a reply is computed for it."""
        free = self._space.free_bytes()
        if self._refused is not None and free is not None and free <= self._refused_free:
            raise DiskFullError(self._refused)

    async def keeping(self, namespace: str, agent_id: str, write: Callable[[], Awaitable[T]]) -> T:
        """Run a metadata write for ``agent_id`` (a transcript, an agent made or deleted)
        with room made for it first; one that finds the disk full anyway is tried again
        once everything of ours that can go is gone, then refused."""
        try:
            result = await self._keeping(namespace, agent_id, write)
        except DiskFullError as error:
            self._refused_free = self._space.free_bytes() or 0
            self._refused = (
                f"{error}; nothing cached is left to evict there, so this was not kept: "
                "free space on that disk and retry"
            )
            raise DiskFullError(self._refused) from error
        self._refused = None
        return result

    async def _keeping(self, namespace: str, agent_id: str, write: Callable[[], Awaitable[T]]) -> T:
        free = self._space.free_bytes()
        if free is not None and free < max(self._reserve, self._floor):
            async with self.lock:
                with contextlib.suppress(DiskFullError):  # the write may fit all the same
                    await self.for_metadata(namespace, agent_id)
        try:
            return await write()
        except DiskFullError:
            async with self.lock:
                with contextlib.suppress(DiskFullError):
                    await self.after_full(namespace, agent_id)
            return await write()

    async def for_metadata(self, namespace: str, agent_id: str) -> None:
        """Under ``lock``: keep the reserve by cutting other records, and the floor by
        cutting this agent's own blocks too."""
        await self.enforce(namespace, agent_id)
        await self.enforce(namespace, agent_id, hard=True)
        self.keep_headroom()

    async def for_block(
        self, namespace: str, agent_id: str, chain: Sequence[str], need: int
    ) -> bool:
        """Under ``lock``, before a block file of about ``need`` bytes is written for
        ``chain``: cut other records to keep the reserve; whether the write leaves the
        floor free (else it is not made)."""
        free = self._space.free_bytes()
        if free is None or max(self._reserve, self._floor) == 0:
            return True
        if free - need < max(self._reserve, self._floor):
            await self.enforce(namespace, agent_id, chain=chain, need=need)
            await self.enforce(namespace, agent_id, chain=chain, need=need, hard=True)
            free = self._space.free_bytes()
        return free is None or self._floor == 0 or free - need >= self._floor

    async def after_full(self, namespace: str, agent_id: str, chain: Sequence[str] = ()) -> None:
        """Under ``lock``: a metadata write found the disk full. Give up the headroom file,
        so the evictions can be recorded, and cut to the floor, this agent included
        (unless ``chain``, a save in flight, is given)."""
        freed = self._space.release_space(headroom=True)
        log.warning(
            "the data directory's disk is full: released %d bytes kept for this, evicting", freed
        )
        await self.enforce(namespace, agent_id, chain=chain, hard=True)

    async def settle(self) -> None:
        """At start: a quota lowered since the files were written (a namespace's or the
        disk's) holds now, not from the next save, as the save would hold it (the least
        valuable agents' blocks go; no agent was just saved)."""
        async with self.lock:
            for namespace in self._namespaces.limited():
                await self._namespaces.enforce(namespace, None)
            quota = self._quota
            if quota is not None and await self._block_records.total_block_bytes() > quota:
                await self.enforce(None, None)

    async def enforce(
        self,
        namespace: str | None,
        agent_id: str | None,
        *,
        chain: Sequence[str] = (),
        need: int = 0,
        hard: bool = False,
    ) -> None:
        """Over the disk quota, or short of the free space to keep (the reserve; with
        ``hard``, the floor), ``need`` bytes more: drop the least recently used records'
        blocks, oldest first, keeping only what a record left whole still uses, then, if
        the quota (or with ``hard`` the floor) still does not hold, the end of the agent
        just saved, which keeps its prefix: the quota is a cap, not a target (the files kept
        to be written over are outside it, and given up first when the disk is short). A
        block shared by old records alone (an agent and its branch, conversations with one
        system prompt) goes with them. The reserve never cuts the agent just saved: a disk
        another program fills would otherwise leave no agent anything cached, not even in
        memory. ``chain`` (a save in flight) is never cut. First, the namespace's own
        quota: it cuts the namespace's blocks only."""
        if not hard and namespace is not None:
            await self._namespaces.enforce(namespace, agent_id, chain)
        limit, short = await self._limit(need, hard)
        if limit is None or await self._block_records.total_block_bytes() <= limit:
            return
        if short and self._space.release_space(headroom=False):
            limit, short = await self._limit(need, hard)  # spares were ours to reuse
            if limit is None or await self._block_records.total_block_bytes() <= limit:
                return
        everyone = await self._agent_records.agents()
        newest = next(
            (a for a in everyone if (a.namespace, a.agent_id) == (namespace, agent_id)), None
        )
        older = [a for a in self._order(everyone) if a is not newest and not _pinned(a)]
        pinned = [key for a in everyone if a is not newest and _pinned(a) for key in a.block_keys]
        kept = [*(newest.block_keys if newest else ()), *chain, *pinned]
        last_user = {key: rank for rank, a in enumerate(older) for key in a.block_keys}
        last_user.update((key, len(older)) for key in kept)
        cut = await self._records_to_cut(older, last_user, limit)
        for agent in older[:cut]:
            await self.cut(agent, [k for k in agent.block_keys if last_user[k] >= cut])
        cap = limit if hard else self._quota
        over = await self._block_records.total_block_bytes() > limit
        if over and newest is not None and cap is not None and not chain:
            await self._cut_end(newest, cap)
        if short:
            self._space.release_space(headroom=False)  # what the cuts set aside to reuse

    async def _records_to_cut(
        self, older: list[AgentRecord], last_user: dict[str, int], limit: int
    ) -> int:
        """How many of the oldest records to cut to be within ``limit``: a block is freed
        once every record using it is cut (all of them, if that is not enough)."""
        excess = await self._block_records.total_block_bytes() - limit
        for rank, agent in enumerate(older):
            rows = await self._block_records.blocks(agent.block_keys)
            excess -= sum(
                rows[k].nbytes for k in set(agent.block_keys) if k in rows and last_user[k] == rank
            )
            if excess <= 0:
                return rank + 1
        return len(older)

    async def _limit(self, need: int, hard: bool) -> tuple[int | None, bool]:
        """The bytes block files may take now: the quota, and no more than leaves the
        reserve (with ``hard``, the floor) and ``need`` free on the disk; None when neither
        applies. And whether the disk is short of that free space."""
        keep = self._floor if hard else self._reserve
        free = self._space.free_bytes() if keep > 0 else None
        if free is None or free >= keep + need:
            return (None if hard else self._quota), False
        room = await self._block_records.total_block_bytes() - (keep + need - free)
        room = max(0, room)
        return (room if self._quota is None or hard else min(self._quota, room)), True

    async def _cut_end(self, agent: AgentRecord, cap: int) -> None:
        """Drop the agent's unshared blocks from its end until ``cap`` holds."""
        records = await self._block_records.blocks(agent.block_keys)
        excess = await self._block_records.total_block_bytes() - cap
        await self.cut(agent, without_tail(agent.block_keys, records, excess))

    async def cut(self, agent: AgentRecord, keep: Sequence[str]) -> None:
        """Keep only the agent's first blocks while they are in ``keep``."""
        records, wanted = await self._block_records.blocks(agent.block_keys), set(keep)
        kept = list(itertools.takewhile(lambda k: k in wanted and k in records, agent.block_keys))
        if len(kept) == len(agent.block_keys):
            return
        if kept or not agent.anonymous:
            tokens = sum(records[k].n_tokens for k in kept)
            shorter = dataclasses.replace(agent, block_keys=tuple(kept), token_count=tokens)
            orphans = await self._recorded(
                lambda: self._agent_records.save_agent_blocks(
                    shorter, [], expected=agent.block_keys
                )
            )
        else:  # a conversation or branch with nothing left is nothing
            orphans = await self._recorded(
                lambda: self._agent_records.delete_agent(
                    agent.namespace, agent.agent_id, expected=agent.block_keys
                )
            )
        self._hot.remove(orphans)
        self._stats.blocks_evicted += len(orphans)
        if orphans:
            await asyncio.to_thread(self._delete_all, list(orphans))

    async def _recorded(self, cut: Callable[[], Awaitable[list[str]]]) -> list[str]:
        """A cut's transaction; on a full disk, once more after giving up the headroom."""
        try:
            return await cut()
        except DiskFullError:
            if not self._space.release_space(headroom=True):
                raise
            return await cut()

    def _delete_all(self, keys: list[str]) -> None:
        for key in keys:
            self._store.delete(key)

    def keep_headroom(self) -> None:
        """Set the headroom file aside again where the disk has room for it (blocks)."""
        self._space.keep_headroom(leaving=self._floor)


def _pinned(agent: AgentRecord) -> bool:
    """A pinned agent's blocks stay on disk whatever other traffic comes (ADR 0028)."""
    return Retention.from_json(agent.retention).pinned
