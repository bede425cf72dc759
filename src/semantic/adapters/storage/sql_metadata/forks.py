"""SQL of a fork: a new agent holding its source's block list and a copy of its transcript."""

from __future__ import annotations

import dataclasses

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from semantic.adapters.storage.schema import agent_blocks, agents, messages
from semantic.adapters.storage.sql_metadata import block_table
from semantic.adapters.storage.sql_metadata.agent_table import (
    agent_exists,
    agent_keys,
    agent_where,
    copy_rows,
)
from semantic.adapters.storage.sqlite_rows import agent_row
from semantic.domain.errors import AgentExistsError
from semantic.ports.metadata_store import AgentRecord


async def fork_rows(
    connection: AsyncConnection, wanted: AgentRecord, source_id: str, now: float
) -> AgentRecord | None:
    """``wanted`` (its namespace, id and system prompt) made from ``source_id`` within a
    transaction, with ``INSERT ... SELECT`` (nothing read into Python but the
    block keys): a next turn on a fork waits for one commit, not four. None when the source
    is gone; ``AgentExistsError`` when ``new_id`` is taken."""
    namespace, new_id = wanted.namespace, wanted.agent_id
    found = await connection.execute(
        select(agents).where(agent_where(agents, namespace, source_id))
    )
    source = found.first()
    if source is None or source.anonymous:
        return None
    if await agent_exists(connection, AgentRecord(namespace, new_id)):
        raise AgentExistsError(new_id, namespace)
    fork = AgentRecord(
        namespace,
        new_id,
        token_count=source.token_count,
        system_prompt=wanted.system_prompt,
        keeps_transcript=True,
        context_policy=source.context_policy,
        forked_from=source_id,
        retention=source.retention,
    )
    await connection.execute(insert(agents).values(**agent_row(fork, now)))
    keys = await agent_keys(connection, namespace, source_id)
    await copy_rows(connection, agent_blocks, namespace, source_id, new_id)
    await copy_rows(connection, messages, namespace, source_id, new_id)
    await connection.execute(block_table.recounted(namespace, new_id))
    return dataclasses.replace(fork, block_keys=tuple(keys), created_at=now, last_used=now)
