"""SQL on the ``generated_replies`` table: replies with tool calls, kept for their round
trip (ADR 0018)."""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncConnection

from semantic.adapters.storage.schema import generated_replies
from semantic.adapters.storage.sql_engines import upsert

REPLIES_KEPT_S = 7 * 24 * 3600.0
"""How long a generated reply with tool calls is kept for its round trip (ADR 0018)."""


async def remember(
    connection: AsyncConnection, namespace: str, key: str, body: str, now: float
) -> None:
    """Kept for ``REPLIES_KEPT_S`` (older ones go now): an agent loop sends a call back
    within minutes."""
    await connection.execute(
        delete(generated_replies).where(generated_replies.c.created_at < now - REPLIES_KEPT_S)
    )
    row = {"namespace": namespace, "key": key, "body": body, "created_at": now}
    await connection.execute(
        upsert(connection, generated_replies).values(**row).on_conflict_do_nothing()
    )


async def remembered(connection: AsyncConnection, namespace: str, key: str) -> str | None:
    found = await connection.execute(
        select(generated_replies.c.body).where(
            generated_replies.c.namespace == namespace, generated_replies.c.key == key
        )
    )
    body = found.scalar()
    return None if body is None else str(body)
