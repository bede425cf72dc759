"""SQL on the ``agents`` and ``agent_blocks`` tables: an agent's row and its block list."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import exists, insert, literal, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection

from semantic.adapters.storage.schema import agent_blocks, agents
from semantic.adapters.storage.sqlite_rows import agent_of, agent_row
from semantic.ports.metadata_store import AgentRecord

AGENTS_PER_READ = 1000


def agent_where(table: Any, namespace: str, agent_id: str) -> Any:
    return (table.c.namespace == namespace) & (table.c.agent_id == agent_id)


def same_agent(left: Any, right: Any) -> Any:
    return (left.c.namespace == right.c.namespace) & (left.c.agent_id == right.c.agent_id)


async def agent_keys(connection: AsyncConnection, namespace: str, agent_id: str) -> list[str]:
    rows = await connection.execute(
        select(agent_blocks.c.block_key)
        .where(agent_where(agent_blocks, namespace, agent_id))
        .order_by(agent_blocks.c.position)
    )
    return [row.block_key for row in rows]


async def read_agent(
    connection: AsyncConnection, namespace: str, agent_id: str
) -> AgentRecord | None:
    found = await connection.execute(select(agents).where(agent_where(agents, namespace, agent_id)))
    row = found.first()
    if row is None:
        return None
    return agent_of(row, await agent_keys(connection, namespace, agent_id))


async def read_agents(connection: AsyncConnection, namespace: str | None) -> list[AgentRecord]:
    """Every agent (of the namespace) by id with its block list, read a thousand agents at
    a time: one query over 10,000 agents' block rows (the dashboard lists them all) held
    the event loop for about 100 ms, as the driver's thread built the rows."""
    found: list[AgentRecord] = []
    after: tuple[str, str] | None = None
    while True:
        batch = await _agents_after(connection, namespace, after)
        found.extend(batch)
        if len(batch) < AGENTS_PER_READ:
            return found
        after = (batch[-1].namespace, batch[-1].agent_id)


async def _agents_after(
    connection: AsyncConnection, namespace: str | None, after: tuple[str, str] | None
) -> list[AgentRecord]:
    """The next ``AGENTS_PER_READ`` agents past ``after`` in (namespace, id) order."""
    order = (agents.c.namespace, agents.c.agent_id)
    query = select(agents).order_by(*order).limit(AGENTS_PER_READ)
    if namespace is not None:
        query = query.where(agents.c.namespace == namespace)
    if after is not None:
        query = query.where(tuple_(*order) > tuple_(*after))
    rows = list(await connection.execute(query))
    if not rows:
        return []
    c = agent_blocks.c
    span = tuple_(c.namespace, c.agent_id).between(
        tuple_(rows[0].namespace, rows[0].agent_id), tuple_(rows[-1].namespace, rows[-1].agent_id)
    )
    held = select(c.namespace, c.agent_id, c.block_key).where(span).order_by(c.position)
    keys: dict[tuple[str, str], list[str]] = {}
    for ns, agent_id, key in await connection.execute(held):  # one query for the batch
        keys.setdefault((ns, agent_id), []).append(key)
    return [agent_of(row, keys.get((row.namespace, row.agent_id), [])) for row in rows]


async def anonymous_ending_at(
    connection: AsyncConnection, namespace: str, keys: Sequence[str]
) -> set[str]:
    """Ids of the namespace's anonymous agents whose block list ends with one of ``keys``."""
    following = agent_blocks.alias("following")
    is_last = ~exists().where(
        following.c.namespace == agent_blocks.c.namespace,
        following.c.agent_id == agent_blocks.c.agent_id,
        following.c.position == agent_blocks.c.position + 1,
    )
    query = (
        select(agent_blocks.c.agent_id)
        .join(agents, same_agent(agents, agent_blocks))
        .where(agent_blocks.c.namespace == namespace, agents.c.anonymous, is_last)
    )
    found: set[str] = set()
    unique = sorted(set(keys))
    for start in range(0, len(unique), 500):
        chunk = agent_blocks.c.block_key.in_(unique[start : start + 500])
        found.update(row.agent_id for row in await connection.execute(query.where(chunk)))
    return found


async def still_holds(
    connection: AsyncConnection, namespace: str, agent_id: str, expected: Sequence[str] | None
) -> bool:
    """The fence of a cut, first in its transaction: the agent's row is locked (an UPDATE,
    so a turn's save of it waits for this transaction or this one for it) and its block
    list compared with ``expected``. ``None``: no fence."""
    if expected is None:
        return True
    where = agent_where(agents, namespace, agent_id)
    locked = await connection.execute(
        update(agents).where(where).values(last_used=agents.c.last_used)
    )
    if locked.rowcount != 1:
        return False
    return await agent_keys(connection, namespace, agent_id) == list(expected)


async def agent_exists(connection: AsyncConnection, agent: AgentRecord) -> bool:
    where = agent_where(agents, agent.namespace, agent.agent_id)
    found = await connection.execute(select(agents.c.agent_id).where(where).limit(1))
    return found.first() is not None


async def upsert_agent(connection: AsyncConnection, agent: AgentRecord, now: float) -> None:
    where = agent_where(agents, agent.namespace, agent.agent_id)
    used = agent.last_used or now
    updated = await connection.execute(
        update(agents).where(where).values(token_count=agent.token_count, last_used=used)
    )
    if updated.rowcount == 0:
        await connection.execute(insert(agents).values(**agent_row(agent, now)))


def held(agent: AgentRecord, keys: Sequence[str]) -> list[dict[str, Any]]:
    """The agent's block list as ``agent_blocks`` rows, in order."""
    return [
        {"namespace": agent.namespace, "agent_id": agent.agent_id, "position": i, "block_key": key}
        for i, key in enumerate(keys)
    ]


async def copy_rows(
    connection: AsyncConnection, table: Any, namespace: str, source_id: str, new_id: str
) -> None:
    """Copy an agent's rows of ``table`` to ``new_id`` inside the database, in their order
    (an autoincrement id, where the table has one, follows it)."""
    names = [c.name for c in table.c if c.name != "id"]
    columns = [literal(new_id).label(n) if n == "agent_id" else table.c[n] for n in names]
    query = select(*columns).where(agent_where(table, namespace, source_id))
    if "id" in table.c:
        query = query.order_by(table.c.id)
    await connection.execute(insert(table).from_select(names, query))
