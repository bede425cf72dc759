"""SQL on the ``messages`` table: an agent's transcript."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from semantic.adapters.storage.schema import messages
from semantic.adapters.storage.sql_metadata.agent_table import agent_where
from semantic.ports.metadata_store import MessageRecord


async def insert_messages(
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


async def messages_of(
    connection: AsyncConnection, namespace: str, agent_id: str
) -> list[MessageRecord]:
    rows = await connection.execute(
        select(messages).where(agent_where(messages, namespace, agent_id)).order_by(messages.c.id)
    )
    return [
        MessageRecord(
            row.role, row.content, row.created_at, row.tool_calls, row.tool_call_id, row.raw
        )
        for row in rows
    ]


async def message_counts(connection: AsyncConnection, namespace: str) -> dict[str, int]:
    rows = await connection.execute(
        select(messages.c.agent_id, func.count().label("n"))
        .where(messages.c.namespace == namespace)
        .group_by(messages.c.agent_id)
    )
    return {row.agent_id: row.n for row in rows}
