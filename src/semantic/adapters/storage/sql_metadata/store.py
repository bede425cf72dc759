"""``SqlMetadataStore``: the metadata store port on SQLite or PostgreSQL. It holds the
transactions, the lease fence each write passes and the in-memory copy of the blocks table;
the SQL of each table group is its own module (``agent_table``, ``block_table``,
``transcripts``, ``replies``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from semantic.adapters.storage.block_rows import BlockRow, BlockRows
from semantic.adapters.storage.lease_fence import check_lease, lease_row
from semantic.adapters.storage.schema import (
    agent_blocks,
    agent_leases,
    agents,
    blocks,
    messages,
)
from semantic.adapters.storage.sql_engines import is_sqlite, sqlite_url
from semantic.adapters.storage.sql_metadata import block_table, replies, transcripts
from semantic.adapters.storage.sql_metadata.agent_table import (
    agent_keys,
    agent_where,
    anonymous_ending_at,
    held,
    read_agent,
    read_agents,
    still_holds,
    upsert_agent,
)
from semantic.adapters.storage.sql_metadata.failures import unavailable_on_failure
from semantic.adapters.storage.sql_metadata.forks import fork_rows
from semantic.adapters.storage.sql_metadata.opening import open_embedded, open_shared
from semantic.adapters.storage.sql_metadata.warm_up import warm_up_reads
from semantic.adapters.storage.sqlite_rows import QUARANTINED, agent_row
from semantic.domain.errors import AgentExistsError
from semantic.ports.leases import Lease
from semantic.ports.metadata_store import AgentRecord, BlockRecord, MessageRecord

Keys = Sequence[str] | None


class SqlMetadataStore:
    """Every metadata role (``ports.metadata_store``) on one engine. ``path``: the SQLite
    file in the data directory; ``url``: another database instead (``postgresql+asyncpg:``,
    shared by the instances of a cluster)."""

    def __init__(self, path: Path, url: str | None = None) -> None:
        self.path = path
        self.url = url or sqlite_url(path)
        self._engine: AsyncEngine | None = None
        self._rows = BlockRows()
        self._copy = is_sqlite(self.url)
        """Whether block lookups answer from ``_rows``: only while no other process can
        change the table (SQLite, its directory locked); on a shared database they read it."""
        self._writing = asyncio.Lock()
        self._undo: list[BlockRow] = []
        self.created = False

    async def open(self) -> None:
        """Create the schema or upgrade it to this release's (``schema_migrations``); then
        run a turn's reads once (``warm_up_reads``)."""
        if self._copy:
            engine, self.created, rows = await open_embedded(self.path, self.url)
            self._rows.put(rows)
        else:
            engine, self.created = await open_shared(self.url)
        self._engine = engine
        async with engine.connect() as connection:
            await warm_up_reads(connection)

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None
            self._rows = BlockRows()

    @unavailable_on_failure
    async def blocks(self, keys: Sequence[str]) -> dict[str, BlockRecord]:
        """From the in-memory copy of the table (``block_rows``), on a shared database from
        the table itself."""
        engine = self._db()  # open, or this raises
        if self._copy:
            return self._rows.get(keys)
        async with engine.connect() as connection:
            rows = await block_table.select_rows(connection, keys)
        return {row.key: row.record() for row in rows}

    @unavailable_on_failure
    async def children(self, parent_key: str) -> list[BlockRecord]:
        engine = self._db()
        if self._copy:
            return self._rows.children(parent_key)
        async with engine.connect() as connection:
            return await block_table.children(connection, parent_key)

    @unavailable_on_failure
    async def save_agent_blocks(
        self,
        agent: AgentRecord,
        new_blocks: Sequence[BlockRecord],
        *,
        expected: Sequence[str] | None = None,
        lease: Lease | None = None,
    ) -> list[str]:
        now = time.time()
        async with self._changing_blocks() as (connection, changed):
            await check_lease(connection, lease)
            if not await still_holds(connection, agent.namespace, agent.agent_id, expected):
                return []
            await block_table.upsert_blocks(connection, new_blocks, now)
            old = await agent_keys(connection, agent.namespace, agent.agent_id)
            await upsert_agent(connection, agent, now)
            where = agent_where(agent_blocks, agent.namespace, agent.agent_id)
            await connection.execute(delete(agent_blocks).where(where))
            if agent.block_keys:
                await connection.execute(insert(agent_blocks), held(agent, agent.block_keys))
            orphans = await self._recount(connection, set(old) | set(agent.block_keys))
            if self._copy:
                read_back = [*agent.block_keys, *old, *(r.key for r in new_blocks)]
                changed.extend(await block_table.select_rows(connection, read_back))
        return orphans

    @unavailable_on_failure
    async def mark_blocks_shared(self, keys: Sequence[str]) -> None:
        """Only the column: the in-memory copy of the table does not carry it."""
        if keys:
            async with self._db().begin() as connection:
                await connection.execute(
                    update(blocks).where(blocks.c.key.in_(list(keys))).values(shared=True)
                )

    @unavailable_on_failure
    async def quarantine_block(self, key: str) -> None:
        async with self._changing_blocks() as (connection, _):
            self._leave_copy([key], drop=False)
            self._rows.quarantine(key)
            await connection.execute(
                update(blocks).where(blocks.c.key == key).values(tier=QUARANTINED)
            )

    @unavailable_on_failure
    async def agent(self, namespace: str, agent_id: str) -> AgentRecord | None:
        async with self._db().connect() as connection:
            return await read_agent(connection, namespace, agent_id)

    @unavailable_on_failure
    async def agents(self, namespace: str | None = None) -> list[AgentRecord]:
        async with self._db().connect() as connection:
            return await read_agents(connection, namespace)

    @unavailable_on_failure
    async def anonymous_agents_ending_at(
        self, namespace: str, keys: Sequence[str]
    ) -> list[AgentRecord]:
        async with self._db().connect() as connection:
            found = await anonymous_ending_at(connection, namespace, keys)
        records = [await self.agent(namespace, agent_id) for agent_id in sorted(found)]
        return [record for record in records if record is not None]

    @unavailable_on_failure
    async def create_agent(self, agent: AgentRecord) -> None:
        now = time.time()
        try:
            async with self._db().begin() as connection:
                await connection.execute(insert(agents).values(**agent_row(agent, now)))
        except IntegrityError:
            raise AgentExistsError(agent.agent_id, agent.namespace) from None

    @unavailable_on_failure
    async def fork_agent(
        self, namespace: str, source_id: str, new_id: str, system_prompt: str | None
    ) -> AgentRecord | None:
        """A new agent holding the source's block list and a copy of its transcript, made
        in one transaction (``forks``). None when the source is gone; ``AgentExistsError``
        when ``new_id`` is taken."""
        async with self._changing_blocks() as (connection, changed):
            wanted = AgentRecord(namespace, new_id, system_prompt=system_prompt)
            fork = await fork_rows(connection, wanted, source_id, time.time())
            if fork is not None and self._copy:
                changed.extend(await block_table.select_rows(connection, fork.block_keys))
        return fork

    @unavailable_on_failure
    async def commit_branch(
        self,
        agent: AgentRecord,
        transcript: Sequence[MessageRecord],
        *,
        lease: Lease | None = None,
    ) -> None:
        """One transaction: the agent (``keeps_transcript``, its system prompt) holding the
        blocks of ``agent.block_keys`` still stored (up to the first gone), and
        ``transcript`` as its messages. A row a save of its turn already made keeps the
        block list that save gave it."""
        now = time.time()
        namespace, agent_id = agent.namespace, agent.agent_id
        async with self._changing_blocks() as (connection, changed):
            await check_lease(connection, lease)
            found = await connection.execute(
                update(agents)
                .where(agent_where(agents, namespace, agent_id))
                .values(system_prompt=agent.system_prompt, keeps_transcript=True)
            )
            if found.rowcount == 0:
                kept = dataclasses.replace(agent, keeps_transcript=True, anonymous=False)
                await connection.execute(insert(agents).values(**agent_row(kept, now)))
                keys = await block_table.still_stored(connection, agent.block_keys)
                if keys:
                    await connection.execute(insert(agent_blocks), held(agent, keys))
                    await connection.execute(block_table.recounted(namespace, agent_id))
                    if self._copy:
                        changed.extend(await block_table.select_rows(connection, keys))
            await transcripts.insert_messages(connection, namespace, agent_id, transcript, now)

    @unavailable_on_failure
    async def delete_agent(
        self, namespace: str, agent_id: str, *, expected: Keys = None, lease: Lease | None = None
    ) -> list[str]:
        """Under the agent's own ``lease``, its lease row goes too: an instance still
        holding an older one then finds it gone."""
        async with self._changing_blocks() as (connection, changed):
            await check_lease(connection, lease)
            if not await still_holds(connection, namespace, agent_id, expected):
                return []
            if lease is not None and (lease.namespace, lease.agent_id) == (namespace, agent_id):
                await connection.execute(delete(agent_leases).where(lease_row(namespace, agent_id)))
            keys = await agent_keys(connection, namespace, agent_id)
            for table in (agent_blocks, messages, agents):
                await connection.execute(
                    delete(table).where(agent_where(table, namespace, agent_id))
                )
            orphans = await self._recount(connection, set(keys))
            if self._copy:
                changed.extend(await block_table.select_rows(connection, keys))
        return orphans

    @unavailable_on_failure
    async def set_retention(self, namespace: str, agent_id: str, retention: str) -> None:
        for attempt in range(2):  # a plain request's first save may make the row meanwhile
            try:
                async with self._db().begin() as connection:
                    where = agent_where(agents, namespace, agent_id)
                    set_ = update(agents).where(where).values(retention=retention)
                    if (await connection.execute(set_)).rowcount == 0:
                        plain = AgentRecord(namespace, agent_id, retention=retention)
                        await connection.execute(
                            insert(agents).values(**agent_row(plain, time.time()))
                        )
                return
            except IntegrityError:
                if attempt:
                    raise

    @unavailable_on_failure
    async def unreferenced_blocks(self) -> list[str]:
        async with self._db().connect() as connection:
            rows = await connection.execute(select(blocks.c.key).where(blocks.c.ref_count <= 0))
            return [row.key for row in rows]

    @unavailable_on_failure
    async def delete_blocks(self, keys: Sequence[str]) -> None:
        async with self._changing_blocks() as (connection, _):
            self._leave_copy(keys)
            await block_table.delete_rows(connection, keys)

    @unavailable_on_failure
    async def all_block_keys(self) -> set[str]:
        async with self._db().connect() as connection:
            return {row.key for row in await connection.execute(select(blocks.c.key))}

    @unavailable_on_failure
    async def total_block_bytes(self) -> int:
        async with self._db().connect() as connection:
            total = (await connection.execute(select(func.sum(blocks.c.nbytes)))).scalar()
            return int(total or 0)

    @unavailable_on_failure
    async def block_bytes_by_namespace(self) -> dict[str, int]:
        query = select(blocks.c.namespace, func.sum(blocks.c.nbytes)).group_by(blocks.c.namespace)
        async with self._db().connect() as connection:
            return {row[0]: int(row[1] or 0) for row in await connection.execute(query)}

    @unavailable_on_failure
    async def append_messages(
        self,
        namespace: str,
        agent_id: str,
        records: Sequence[MessageRecord],
        *,
        lease: Lease | None = None,
    ) -> None:
        if not records:
            return
        now = time.time()
        async with self._db().begin() as connection:
            await check_lease(connection, lease)
            await transcripts.insert_messages(connection, namespace, agent_id, records, now)

    @unavailable_on_failure
    async def messages(self, namespace: str, agent_id: str) -> list[MessageRecord]:
        async with self._db().connect() as connection:
            return await transcripts.messages_of(connection, namespace, agent_id)

    @unavailable_on_failure
    async def transcript(
        self, namespace: str, agent_id: str
    ) -> tuple[AgentRecord, list[MessageRecord]] | None:
        """The agent and its messages read on one connection: what a branch of it starts
        from, before its first token."""
        async with self._db().connect() as connection:
            record = await read_agent(connection, namespace, agent_id)
            if record is None:
                return None
            return record, await transcripts.messages_of(connection, namespace, agent_id)

    @unavailable_on_failure
    async def message_counts(self, namespace: str) -> dict[str, int]:
        async with self._db().connect() as connection:
            return await transcripts.message_counts(connection, namespace)

    @unavailable_on_failure
    async def remember_reply(self, namespace: str, key: str, body: str) -> None:
        async with self._db().begin() as connection:
            await replies.remember(connection, namespace, key, body, time.time())

    @unavailable_on_failure
    async def remembered_reply(self, namespace: str, key: str) -> str | None:
        async with self._db().connect() as connection:
            return await replies.remembered(connection, namespace, key)

    @contextlib.asynccontextmanager
    async def _changing_blocks(self) -> AsyncIterator[tuple[AsyncConnection, list[BlockRow]]]:
        """A transaction that may change the blocks table, under the lock that keeps the
        in-memory copy in step: rows it removes or quarantines leave the copy before it
        commits (``_leave_copy``: no lookup meanwhile finds a block being deleted) and come
        back if it rolls back; rows put in ``changed`` enter the copy once it commits."""
        changed: list[BlockRow] = []
        async with self._writing:
            self._undo = []
            try:
                async with self._db().begin() as connection:
                    yield connection, changed
            except BaseException:
                self._rows.put(self._undo)
                raise
            finally:
                self._undo = []
            self._rows.put(changed)

    def _leave_copy(self, keys: Sequence[str], *, drop: bool = True) -> None:
        """Within ``_changing_blocks``: keep the rows to put back on a rollback."""
        self._undo.extend(self._rows.rows(keys))
        if drop:
            self._rows.drop(keys)

    async def _recount(self, connection: AsyncConnection, keys: set[str]) -> list[str]:
        """Recompute reference counts of ``keys``; delete and return the unreferenced."""
        orphans = await block_table.recount(connection, keys)
        if orphans:
            self._leave_copy(orphans)
            await block_table.delete_rows(connection, orphans)
        return orphans

    def engine(self) -> AsyncEngine:
        """The open database, for the stored objects kept in it (``SqliteObjectStore``)."""
        return self._db()

    def _db(self) -> AsyncEngine:
        if self._engine is None:
            raise RuntimeError("SqlMetadataStore.open() was not called")
        return self._engine
