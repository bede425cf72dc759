"""The dashboard's read model: every agent's blocks by tier, each tenant's share, lineage.

Read from the books the server keeps anyway (the metadata store's agents and blocks, the
memory index, the turn history): no second record to drift from the first. It reads only;
it never waits on the engine, so a page open on a busy server never slows a turn.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from semantic.application.agents.values import INTERNAL_PREFIX
from semantic.application.cache.hot_index import HotIndex
from semantic.application.dashboard.turn_history import TurnHistory
from semantic.domain.errors import AgentNotFoundError, InvalidRequestError
from semantic.domain.generation import FinishedRequest
from semantic.domain.retention import Retention
from semantic.ports.metadata_store import AgentRecord, AgentRecords, BlockRecords

SORT_KEYS: Final = (
    "agent",
    "tokens",
    "blocks",
    "memory_blocks",
    "disk_blocks",
    "last_used",
    "cached_share",
    "retention",
)
MAX_PAGE: Final = 500
FRESH_S: Final = 1.0
"""How long one read of the agents serves the page's other calls."""


@dataclass(frozen=True, slots=True)
class AgentRow:
    namespace: str
    agent_id: str
    anonymous: bool
    tokens: int
    blocks: int
    memory_blocks: int
    disk_blocks: int
    created_at: float
    last_used: float
    forked_from: str | None
    cached_share: float | None
    """Of the prompt tokens of its last turns (this process's), the share not computed."""
    retention: Retention


@dataclass(frozen=True, slots=True)
class AgentPage:
    rows: tuple[AgentRow, ...]
    total: int
    """Agents matching, over all pages."""


@dataclass(frozen=True, slots=True)
class NamespaceUsage:
    namespace: str
    agents: int
    tokens: int
    memory_bytes: int
    disk_bytes: int
    """Each block counted once per namespace, however many of its agents hold it."""


@dataclass(frozen=True, slots=True)
class BlockView:
    key: str
    tokens: int
    in_memory: bool
    on_disk: bool
    holders: int
    """Agents holding it (forks, a shared prompt): above one, it is stored once for all."""


@dataclass(frozen=True, slots=True)
class AgentDetail:
    row: AgentRow
    system_prompt: str | None
    forks: tuple[str, ...]
    """Agents forked from this one."""
    sharing: tuple[str, ...]
    """Other agents of its namespace holding any of its blocks."""
    blocks: tuple[BlockView, ...]
    recent: tuple[FinishedRequest, ...]

    @property
    def shared_blocks(self) -> int:
        return sum(1 for block in self.blocks if block.holders > 1)


@dataclass(frozen=True, slots=True)
class PageQuery:
    """Which agents, in which order, which slice."""

    sort: str = "last_used"
    descending: bool = True
    offset: int = 0
    limit: int = 50
    search: str = ""
    anonymous: bool = False
    """Conversations without an agent id too (``~anon-...``), and the agents the server
    keeps for its own use (a Responses chain's, ``~resp:...``)."""

    def __post_init__(self) -> None:
        if self.sort not in SORT_KEYS:
            raise InvalidRequestError(
                f"sort must be one of {', '.join(SORT_KEYS)}, not {self.sort[:40]!r}",
                param="sort",
            )
        if not 1 <= self.limit <= MAX_PAGE:
            raise InvalidRequestError(f"limit must be 1-{MAX_PAGE}", param="limit")
        if self.offset < 0:
            raise InvalidRequestError("offset must be 0 or more", param="offset")


class Dashboard:
    """``namespaces`` arguments say what the asker may see: None, every namespace."""

    def __init__(
        self,
        agent_records: AgentRecords,
        block_records: BlockRecords,
        in_memory: HotIndex,
        history: TurnHistory,
        *,
        pool_block_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``pool_block_bytes``: one layer's block in the pool (a block in memory holds
        one per layer it keeps)."""
        self._agent_records = agent_records
        self._block_records = block_records
        self._in_memory = in_memory
        self._history = history
        self._pool_block_bytes = pool_block_bytes
        self._clock = clock
        self._listed: (
            tuple[float, frozenset[str] | None, asyncio.Future[list[AgentRecord]]] | None
        ) = None

    @property
    def history(self) -> TurnHistory:
        return self._history

    async def stored_bytes(self) -> int:
        """Bytes of the block files the metadata store knows (with a database instances
        share, theirs too)."""
        return await self._block_records.total_block_bytes()

    async def agents(self, namespaces: Collection[str] | None, query: PageQuery) -> AgentPage:
        records = await self._records(namespaces)
        on_disk = await self._block_records.all_block_keys()
        shares = self._history.cached_shares()  # here: the history changes on this loop
        return await asyncio.to_thread(self._page, records, on_disk, shares, query)

    async def usage(self, namespaces: Collection[str] | None) -> list[NamespaceUsage]:
        """Per namespace, what its agents hold in memory and on disk."""
        records = await self._records(namespaces)
        on_disk = await self._block_records.block_bytes_by_namespace()
        return await asyncio.to_thread(self._usages, records, on_disk)

    async def agent(self, namespace: str, agent_id: str) -> AgentDetail:
        record = await self._agent_records.agent(namespace, agent_id)
        if record is None:
            raise AgentNotFoundError(agent_id, namespace)
        neighbours = [
            other for other in await self._agent_records.agents(namespace) if other != record
        ]
        stored = await self._block_records.blocks(record.block_keys)
        blocks = tuple(
            BlockView(
                key,
                stored[key].n_tokens if key in stored else 0,
                key in self._in_memory,
                key in stored,
                stored[key].ref_count if key in stored else 1,
            )
            for key in record.block_keys
        )
        mine = set(record.block_keys)
        return AgentDetail(
            self._row(record, stored.keys(), self._history.cached_share(namespace, agent_id)),
            record.system_prompt,
            tuple(sorted(o.agent_id for o in neighbours if o.forked_from == agent_id)),
            tuple(sorted(o.agent_id for o in neighbours if mine.intersection(o.block_keys))),
            blocks,
            self._history.recent(namespace, agent_id),
        )

    async def _records(self, namespaces: Collection[str] | None) -> list[AgentRecord]:
        """The agents in ``namespaces``; one read serves the calls of one refresh (the page
        asks for the overview and the agents at once), the second waiting on the first."""
        scope = None if namespaces is None else frozenset(namespaces)
        now = self._clock()
        listed = self._listed
        if listed is None or listed[1] != scope or now - listed[0] >= FRESH_S:
            listed = (now, scope, asyncio.ensure_future(self._read(scope)))
            self._listed = listed
        return await asyncio.shield(listed[2])

    async def _read(self, scope: frozenset[str] | None) -> list[AgentRecord]:
        if scope is None:
            return await self._agent_records.agents()
        return [
            r for namespace in sorted(scope) for r in await self._agent_records.agents(namespace)
        ]

    def _page(
        self,
        records: Sequence[AgentRecord],
        on_disk: Container[str],
        shares: Mapping[tuple[str, str], float],
        query: PageQuery,
    ) -> AgentPage:
        """Off the event loop: 10,000 agents take a few hundred milliseconds to rank."""
        rows = [
            self._row(record, on_disk, shares.get((record.namespace, record.agent_id)))
            for record in records
            if (query.anonymous or not _internal(record)) and query.search in record.agent_id
        ]
        rows.sort(key=_sort_key(query.sort), reverse=query.descending)
        return AgentPage(tuple(rows[query.offset : query.offset + query.limit]), len(rows))

    def _usages(
        self, records: Sequence[AgentRecord], on_disk: Mapping[str, int]
    ) -> list[NamespaceUsage]:
        by_namespace: dict[str, list[AgentRecord]] = {}
        for record in records:
            by_namespace.setdefault(record.namespace, []).append(record)
        return [
            self._usage(namespace, mine, on_disk.get(namespace, 0))
            for namespace, mine in sorted(by_namespace.items())
        ]

    def _row(
        self, record: AgentRecord, on_disk: Container[str], cached_share: float | None
    ) -> AgentRow:
        keys = record.block_keys
        return AgentRow(
            record.namespace,
            record.agent_id,
            record.anonymous,
            record.token_count,
            len(keys),
            sum(1 for key in keys if key in self._in_memory),
            sum(1 for key in keys if key in on_disk),
            record.created_at,
            record.last_used,
            record.forked_from,
            cached_share,
            Retention.from_json(record.retention),
        )

    def _usage(self, namespace: str, records: Sequence[AgentRecord], disk: int) -> NamespaceUsage:
        keys = _distinct_keys(records)
        return NamespaceUsage(
            namespace,
            sum(1 for record in records if not record.anonymous),
            sum(record.token_count for record in records),
            sum(self._memory_bytes(key) for key in keys),
            disk,
        )

    def _memory_bytes(self, key: str) -> int:
        block = self._in_memory.peek(key)
        return 0 if block is None else len(block.pool_ids()) * self._pool_block_bytes


def _distinct_keys(records: Sequence[AgentRecord]) -> list[str]:
    return list(dict.fromkeys(key for record in records for key in record.block_keys))


def _sort_key(sort: str) -> Callable[[AgentRow], tuple[Any, ...]]:
    """Rows ordered by ``sort``, ties (and agents without a share) by namespace and id."""

    def key(row: AgentRow) -> tuple[Any, ...]:
        value = (
            row.agent_id
            if sort == "agent"
            else _kept(row.retention)
            if sort == "retention"
            else getattr(row, sort)
        )
        return (value is not None, value if value is not None else 0, row.namespace, row.agent_id)

    return key


def _kept(retention: Retention) -> tuple[bool, float, int]:
    """How strongly an agent asks to be kept: a pin, then a TTL, then its priority."""
    return (retention.pinned, retention.ttl_seconds or 0.0, retention.priority)


def _internal(record: AgentRecord) -> bool:
    return record.anonymous or record.agent_id.startswith(INTERNAL_PREFIX)
