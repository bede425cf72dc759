"""The metadata store on SQLite (WAL, aiosqlite) or PostgreSQL (asyncpg), through
SQLAlchemy 2's asyncio API; ``sql_engines`` holds what differs between the two."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import delete, exists, func, insert, literal, select, update
from sqlalchemy.exc import DatabaseError, DBAPIError, IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from semantic.adapters.storage.block_rows import BlockRow, BlockRows
from semantic.adapters.storage.lease_fence import check_lease, lease_row
from semantic.adapters.storage.schema import (
    agent_blocks,
    agent_leases,
    agents,
    blocks,
    generated_replies,
    messages,
)
from semantic.adapters.storage.schema_migrations import upgrade_schema
from semantic.adapters.storage.sql_engines import (
    create_engine,
    is_sqlite,
    shown,
    sqlite_url,
    upsert,
)
from semantic.adapters.storage.sqlite_rows import (
    QUARANTINED,
    agent_of,
    agent_row,
    block_row,
    block_row_of,
)
from semantic.domain.errors import (
    AgentExistsError,
    DataDirectoryUnusableError,
    DiskFullError,
    StorageUnavailableError,
)
from semantic.ports.leases import Lease
from semantic.ports.metadata_store import AgentRecord, BlockRecord, MessageRecord

log = logging.getLogger(__name__)
P = ParamSpec("P")
REPLIES_KEPT_S = 7 * 24 * 3600.0
"""How long a generated reply with tool calls is kept for its round trip (ADR 0018)."""
R = TypeVar("R")


def unavailable_on_failure(
    method: Callable[P, Coroutine[Any, Any, R]],
) -> Callable[P, Coroutine[Any, Any, R]]:
    """SQLite's own failures (a read-only or full disk, a database locked past its busy
    timeout) become ``StorageUnavailableError``: the edge answers 503 naming the storage,
    not 500; a full disk becomes ``DiskFullError``, naming the directory, so the caller can
    free room and try again. PostgreSQL out of reach (refused, timed out, a connection lost
    mid-transaction) is unavailable too. The transaction was rolled back (PostgreSQL rolls
    back what a lost connection left open), so nothing half-done is kept."""

    @functools.wraps(method)
    async def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await method(*args, **kwargs)
        except OperationalError as error:
            if _disk_full(error):
                path = getattr(args[0], "path", None)
                where = path.parent if isinstance(path, Path) else "?"
                raise DiskFullError(
                    f"the disk holding the data directory {where} is full ({error.orig})"
                ) from error
            raise StorageUnavailableError(f"the metadata store failed: {error.orig}") from error
        except IntegrityError as error:  # a change that raced another (a cut block), undone
            raise StorageUnavailableError(
                f"the metadata store refused a change that raced another ({error.orig}); try again"
            ) from error
        except DBAPIError as error:  # PostgreSQL: a connection lost in the middle, a timeout
            raise StorageUnavailableError(f"the metadata store failed: {error.orig}") from error
        except (OSError, TimeoutError) as error:  # PostgreSQL: no connection could be made
            raise StorageUnavailableError(
                f"the metadata database cannot be reached ({error}); try again"
            ) from error

    return guarded


_SQLITE_FULL = 13


def _disk_full(error: OperationalError) -> bool:
    """SQLite's own code for a write that found no room (``SQLITE_FULL``, any variant)."""
    code = getattr(error.orig, "sqlite_errorcode", None)
    return (isinstance(code, int) and code & 0xFF == _SQLITE_FULL) or "disk is full" in str(
        error.orig
    )


class SqliteMetadataStore:
    """``path``: the SQLite file in the data directory; ``url``: another database instead
    (``postgresql+asyncpg://...``, shared by the instances of a cluster)."""

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
        """Create the schema or upgrade it to this release's (``schema_migrations``)."""
        if self._copy:
            await self._open_embedded()
        else:
            await self._open_shared()

    async def _open_embedded(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(self.url)
        try:
            async with engine.connect() as connection:
                self.created = await upgrade_schema(connection, shown(self.url))
                rows = await connection.execute(select(blocks))
                self._rows.put(block_row_of(row) for row in rows)
        except DatabaseError as error:
            await engine.dispose()
            if isinstance(error, OperationalError):  # locked, a full disk...: not the file
                raise
            raise DataDirectoryUnusableError(
                f"the metadata database {self.path} cannot be read ({error.orig}); move it "
                "aside to start with an empty one (the block files beside it are then set "
                "aside too)"
            ) from error
        except BaseException:  # a database from a newer release, refused
            await engine.dispose()
            raise
        self._engine = engine

    async def _open_shared(self) -> None:
        """A database server: out of reach, or refusing us, is said with its URL (password
        hidden), and the server exits with that line, no traceback."""
        engine = create_engine(self.url)
        try:
            async with engine.connect() as connection:
                self.created = await upgrade_schema(connection, shown(self.url))
        except (DBAPIError, OSError, TimeoutError) as error:
            await engine.dispose()
            reason = getattr(error, "orig", None) or error
            raise StorageUnavailableError(
                f"cannot use the metadata database {shown(self.url)}: {reason}"
            ) from error
        except BaseException:
            await engine.dispose()
            raise
        log.info("metadata in %s", shown(self.url))
        self._engine = engine

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
            rows = await _select_rows(connection, keys)
        return {row.key: row.record() for row in rows}

    @unavailable_on_failure
    async def children(self, parent_key: str) -> list[BlockRecord]:
        engine = self._db()
        if self._copy:
            return self._rows.children(parent_key)
        async with engine.connect() as connection:
            rows = await connection.execute(
                select(blocks).where(blocks.c.parent_key == parent_key).order_by(blocks.c.key)
            )
            return [block_row_of(row).record() for row in rows]

    @unavailable_on_failure
    async def save_agent_blocks(
        self,
        agent: AgentRecord,
        new_blocks: Sequence[BlockRecord],
        *,
        create: bool = True,
        lease: Lease | None = None,
    ) -> list[str]:
        now = time.time()
        async with self._changing_blocks() as (connection, changed):
            await check_lease(connection, lease)
            if not create and not await self._agent_exists(connection, agent):
                return []
            for record in new_blocks:
                row = block_row(record, now)
                replace = {k: row[k] for k in ("nbytes", "checksum", "tier")}
                await connection.execute(
                    upsert(connection, blocks)
                    .values(**row)
                    .on_conflict_do_update(index_elements=[blocks.c.key], set_=replace)
                )
            old = await self._agent_keys(connection, agent.namespace, agent.agent_id)
            await self._upsert_agent(connection, agent, now)
            where = _agent_where(agent_blocks, agent.namespace, agent.agent_id)
            await connection.execute(delete(agent_blocks).where(where))
            if agent.block_keys:
                await connection.execute(insert(agent_blocks), _held(agent, agent.block_keys))
            orphans = await self._recount(connection, set(old) | set(agent.block_keys))
            if self._copy:
                read_back = [*agent.block_keys, *old, *(r.key for r in new_blocks)]
                changed.extend(await _select_rows(connection, read_back))
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
            row = (
                await connection.execute(
                    select(agents).where(_agent_where(agents, namespace, agent_id))
                )
            ).first()
            if row is None:
                return None
            keys = await self._agent_keys(connection, namespace, agent_id)
            return agent_of(row, keys)

    @unavailable_on_failure
    async def agents(self, namespace: str | None = None) -> list[AgentRecord]:
        async with self._db().connect() as connection:
            query = select(agents).order_by(agents.c.namespace, agents.c.agent_id)
            held = select(agent_blocks).order_by(agent_blocks.c.position)
            if namespace is not None:
                query = query.where(agents.c.namespace == namespace)
                held = held.where(agent_blocks.c.namespace == namespace)
            keys: dict[tuple[str, str], list[str]] = {}
            for row in await connection.execute(held):  # one query, not one per agent
                keys.setdefault((row.namespace, row.agent_id), []).append(row.block_key)
            rows = await connection.execute(query)
            return [agent_of(row, keys.get((row.namespace, row.agent_id), [])) for row in rows]

    @unavailable_on_failure
    async def anonymous_agents_ending_at(
        self, namespace: str, keys: Sequence[str]
    ) -> list[AgentRecord]:
        following = agent_blocks.alias("following")
        is_last = ~exists().where(
            following.c.namespace == agent_blocks.c.namespace,
            following.c.agent_id == agent_blocks.c.agent_id,
            following.c.position == agent_blocks.c.position + 1,
        )
        query = (
            select(agent_blocks.c.agent_id)
            .join(agents, _same_agent(agents, agent_blocks))
            .where(agent_blocks.c.namespace == namespace, agents.c.anonymous, is_last)
        )
        found: set[str] = set()
        async with self._db().connect() as connection:
            unique = sorted(set(keys))
            for start in range(0, len(unique), 500):
                chunk = agent_blocks.c.block_key.in_(unique[start : start + 500])
                found.update(row.agent_id for row in await connection.execute(query.where(chunk)))
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
        in one transaction with ``INSERT ... SELECT`` (nothing read into Python but the
        block keys): a next turn on a fork waits for one commit, not four. None when the
        source is gone; ``AgentExistsError`` when ``new_id`` is taken."""
        now = time.time()
        async with self._changing_blocks() as (connection, changed):
            found = await connection.execute(
                select(agents).where(_agent_where(agents, namespace, source_id))
            )
            source = found.first()
            if source is None or source.anonymous:
                return None
            if await self._agent_exists(connection, AgentRecord(namespace, new_id)):
                raise AgentExistsError(new_id, namespace)
            fork = AgentRecord(
                namespace,
                new_id,
                token_count=source.token_count,
                system_prompt=system_prompt,
                keeps_transcript=True,
            )
            await connection.execute(insert(agents).values(**agent_row(fork, now)))
            keys = await self._agent_keys(connection, namespace, source_id)
            await _copy_rows(connection, agent_blocks, namespace, source_id, new_id)
            await _copy_rows(connection, messages, namespace, source_id, new_id)
            await connection.execute(_recounted(namespace, new_id))
            if self._copy:
                changed.extend(await _select_rows(connection, keys))
        return dataclasses.replace(fork, block_keys=tuple(keys), created_at=now, last_used=now)

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
                .where(_agent_where(agents, namespace, agent_id))
                .values(system_prompt=agent.system_prompt, keeps_transcript=True)
            )
            if found.rowcount == 0:
                kept = dataclasses.replace(agent, keeps_transcript=True, anonymous=False)
                await connection.execute(insert(agents).values(**agent_row(kept, now)))
                keys = await _still_stored(connection, agent.block_keys)
                if keys:
                    await connection.execute(insert(agent_blocks), _held(agent, keys))
                    await connection.execute(_recounted(namespace, agent_id))
                    if self._copy:
                        changed.extend(await _select_rows(connection, keys))
            await _insert_messages(connection, namespace, agent_id, transcript, now)

    @unavailable_on_failure
    async def delete_agent(
        self, namespace: str, agent_id: str, *, lease: Lease | None = None
    ) -> list[str]:
        """Under the agent's own ``lease``, its lease row goes too: an instance still
        holding an older one then finds it gone."""
        async with self._changing_blocks() as (connection, changed):
            await check_lease(connection, lease)
            if lease is not None and (lease.namespace, lease.agent_id) == (namespace, agent_id):
                await connection.execute(delete(agent_leases).where(lease_row(namespace, agent_id)))
            keys = await self._agent_keys(connection, namespace, agent_id)
            await connection.execute(
                delete(agent_blocks).where(_agent_where(agent_blocks, namespace, agent_id))
            )
            await connection.execute(
                delete(messages).where(_agent_where(messages, namespace, agent_id))
            )
            await connection.execute(
                delete(agents).where(_agent_where(agents, namespace, agent_id))
            )
            orphans = await self._recount(connection, set(keys))
            if self._copy:
                changed.extend(await _select_rows(connection, keys))
        return orphans

    @unavailable_on_failure
    async def touch_agent(self, namespace: str, agent_id: str, when: float) -> None:
        async with self._db().begin() as connection:
            await connection.execute(
                update(agents)
                .where(_agent_where(agents, namespace, agent_id))
                .values(last_used=when)
            )

    @unavailable_on_failure
    async def unreferenced_blocks(self) -> list[str]:
        async with self._db().connect() as connection:
            rows = await connection.execute(select(blocks.c.key).where(blocks.c.ref_count <= 0))
            return [row.key for row in rows]

    @unavailable_on_failure
    async def delete_blocks(self, keys: Sequence[str]) -> None:
        async with self._changing_blocks() as (connection, _):
            self._leave_copy(keys)
            for start in range(0, len(keys), 500):
                chunk = list(keys[start : start + 500])
                await connection.execute(delete(blocks).where(blocks.c.key.in_(chunk)))

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
            await _insert_messages(connection, namespace, agent_id, records, now)

    @unavailable_on_failure
    async def messages(self, namespace: str, agent_id: str) -> list[MessageRecord]:
        async with self._db().connect() as connection:
            return await _messages_of(connection, namespace, agent_id)

    @unavailable_on_failure
    async def transcript(
        self, namespace: str, agent_id: str
    ) -> tuple[AgentRecord, list[MessageRecord]] | None:
        """The agent and its messages read on one connection: what a branch of it starts
        from, before its first token."""
        async with self._db().connect() as connection:
            row = (
                await connection.execute(
                    select(agents).where(_agent_where(agents, namespace, agent_id))
                )
            ).first()
            if row is None:
                return None
            keys = await self._agent_keys(connection, namespace, agent_id)
            return agent_of(row, keys), await _messages_of(connection, namespace, agent_id)

    @unavailable_on_failure
    async def message_counts(self, namespace: str) -> dict[str, int]:
        async with self._db().connect() as connection:
            rows = await connection.execute(
                select(messages.c.agent_id, func.count().label("n"))
                .where(messages.c.namespace == namespace)
                .group_by(messages.c.agent_id)
            )
            return {row.agent_id: row.n for row in rows}

    @unavailable_on_failure
    async def remember_reply(self, namespace: str, key: str, body: str) -> None:
        """Kept for ``REPLIES_KEPT_S``: an agent loop sends a call back within minutes."""
        now = time.time()
        async with self._db().begin() as connection:
            await connection.execute(
                delete(generated_replies).where(
                    generated_replies.c.created_at < now - REPLIES_KEPT_S
                )
            )
            row = {"namespace": namespace, "key": key, "body": body, "created_at": now}
            await connection.execute(
                upsert(connection, generated_replies).values(**row).on_conflict_do_nothing()
            )

    @unavailable_on_failure
    async def remembered_reply(self, namespace: str, key: str) -> str | None:
        async with self._db().connect() as connection:
            found = await connection.execute(
                select(generated_replies.c.body).where(
                    generated_replies.c.namespace == namespace, generated_replies.c.key == key
                )
            )
            body = found.scalar()
            return None if body is None else str(body)

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

    def engine(self) -> AsyncEngine:
        """The open database, for the stored objects kept in it (``SqliteObjectStore``)."""
        return self._db()

    def _db(self) -> AsyncEngine:
        if self._engine is None:
            raise RuntimeError("SqliteMetadataStore.open() was not called")
        return self._engine

    @staticmethod
    async def _agent_keys(connection: AsyncConnection, namespace: str, agent_id: str) -> list[str]:
        rows = await connection.execute(
            select(agent_blocks.c.block_key)
            .where(_agent_where(agent_blocks, namespace, agent_id))
            .order_by(agent_blocks.c.position)
        )
        return [row.block_key for row in rows]

    @staticmethod
    async def _agent_exists(connection: AsyncConnection, agent: AgentRecord) -> bool:
        where = _agent_where(agents, agent.namespace, agent.agent_id)
        found = await connection.execute(select(agents.c.agent_id).where(where).limit(1))
        return found.first() is not None

    @staticmethod
    async def _upsert_agent(connection: AsyncConnection, agent: AgentRecord, now: float) -> None:
        where = _agent_where(agents, agent.namespace, agent.agent_id)
        used = agent.last_used or now
        updated = await connection.execute(
            update(agents).where(where).values(token_count=agent.token_count, last_used=used)
        )
        if updated.rowcount == 0:
            await connection.execute(insert(agents).values(**agent_row(agent, now)))

    async def _recount(self, connection: AsyncConnection, keys: set[str]) -> list[str]:
        """Recompute reference counts of ``keys``; delete and return the unreferenced."""
        orphans = []
        for key in keys:
            count = (
                await connection.execute(
                    select(func.count())
                    .select_from(agent_blocks)
                    .where(agent_blocks.c.block_key == key)
                )
            ).scalar_one()
            await connection.execute(
                update(blocks).where(blocks.c.key == key).values(ref_count=count)
            )
            if count == 0:
                orphans.append(key)
        if orphans:
            self._leave_copy(orphans)
            await connection.execute(delete(blocks).where(blocks.c.key.in_(orphans)))
        return orphans


def _agent_where(table: Any, namespace: str, agent_id: str) -> Any:
    return (table.c.namespace == namespace) & (table.c.agent_id == agent_id)


def _same_agent(left: Any, right: Any) -> Any:
    return (left.c.namespace == right.c.namespace) & (left.c.agent_id == right.c.agent_id)


async def _select_rows(connection: AsyncConnection, keys: Sequence[str]) -> list[BlockRow]:
    out: list[BlockRow] = []
    unique = sorted(set(keys))
    for start in range(0, len(unique), 500):
        chunk = unique[start : start + 500]
        rows = await connection.execute(select(blocks).where(blocks.c.key.in_(chunk)))
        out += (block_row_of(row) for row in rows)
    return out


async def _copy_rows(
    connection: AsyncConnection, table: Any, namespace: str, source_id: str, new_id: str
) -> None:
    """Copy an agent's rows of ``table`` to ``new_id`` inside the database, in their order
    (an autoincrement id, where the table has one, follows it)."""
    names = [c.name for c in table.c if c.name != "id"]
    columns = [literal(new_id).label(n) if n == "agent_id" else table.c[n] for n in names]
    query = select(*columns).where(_agent_where(table, namespace, source_id))
    if "id" in table.c:
        query = query.order_by(table.c.id)
    await connection.execute(insert(table).from_select(names, query))


def _recounted(namespace: str, agent_id: str) -> Any:
    """Each block the agent holds gets its reference count recomputed in the database."""
    holders = agent_blocks.alias("holders")
    count = (
        select(func.count())
        .select_from(holders)
        .where(holders.c.block_key == blocks.c.key)
        .scalar_subquery()
    )
    held = select(agent_blocks.c.block_key).where(_agent_where(agent_blocks, namespace, agent_id))
    return update(blocks).where(blocks.c.key.in_(held)).values(ref_count=count)


def _held(agent: AgentRecord, keys: Sequence[str]) -> list[dict[str, Any]]:
    """The agent's block list as ``agent_blocks`` rows, in order."""
    return [
        {"namespace": agent.namespace, "agent_id": agent.agent_id, "position": i, "block_key": key}
        for i, key in enumerate(keys)
    ]


async def _still_stored(connection: AsyncConnection, keys: Sequence[str]) -> list[str]:
    """``keys`` up to the first whose block is gone (a delete since they were read)."""
    present = {row.key for row in await _select_rows(connection, keys)}
    kept: list[str] = []
    for key in keys:
        if key not in present:
            break
        kept.append(key)
    return kept


async def _insert_messages(
    connection: AsyncConnection,
    namespace: str,
    agent_id: str,
    records: Sequence[MessageRecord],
    now: float,
) -> None:
    if not records:
        return
    rows = [
        {
            "namespace": namespace,
            "agent_id": agent_id,
            "role": m.role,
            "content": m.content,
            "created_at": m.created_at or now,
            "tool_calls": m.tool_calls,
            "tool_call_id": m.tool_call_id,
            "raw": m.raw,
        }
        for m in records
    ]
    await connection.execute(insert(messages), rows)


async def _messages_of(
    connection: AsyncConnection, namespace: str, agent_id: str
) -> list[MessageRecord]:
    rows = await connection.execute(
        select(messages).where(_agent_where(messages, namespace, agent_id)).order_by(messages.c.id)
    )
    return [
        MessageRecord(
            row.role, row.content, row.created_at, row.tool_calls, row.tool_call_id, row.raw
        )
        for row in rows
    ]
