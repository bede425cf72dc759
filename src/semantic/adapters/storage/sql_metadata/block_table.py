"""SQL on the ``blocks`` table: rows read by key, new rows upserted, reference counts
recomputed from the agents' block lists."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from semantic.adapters.storage.block_rows import BlockRow
from semantic.adapters.storage.schema import agent_blocks, blocks
from semantic.adapters.storage.sql_engines import upsert
from semantic.adapters.storage.sql_metadata.agent_table import agent_where
from semantic.adapters.storage.sqlite_rows import block_row, block_row_of
from semantic.ports.metadata_store import BlockRecord

CHUNK = 500
"""Keys per ``IN (...)``: well under SQLite's limit on bound parameters."""


async def select_rows(connection: AsyncConnection, keys: Sequence[str]) -> list[BlockRow]:
    out: list[BlockRow] = []
    unique = sorted(set(keys))
    for start in range(0, len(unique), CHUNK):
        chunk = unique[start : start + CHUNK]
        rows = await connection.execute(select(blocks).where(blocks.c.key.in_(chunk)))
        out += (block_row_of(row) for row in rows)
    return out


async def still_stored(connection: AsyncConnection, keys: Sequence[str]) -> list[str]:
    """``keys`` up to the first whose block is gone (a delete since they were read)."""
    present = {row.key for row in await select_rows(connection, keys)}
    kept: list[str] = []
    for key in keys:
        if key not in present:
            break
        kept.append(key)
    return kept


async def children(connection: AsyncConnection, parent_key: str) -> list[BlockRecord]:
    rows = await connection.execute(
        select(blocks).where(blocks.c.parent_key == parent_key).order_by(blocks.c.key)
    )
    return [block_row_of(row).record() for row in rows]


async def upsert_blocks(
    connection: AsyncConnection, records: Sequence[BlockRecord], now: float
) -> None:
    """New rows, or a stored row's file facts replaced (a block written again)."""
    for record in records:
        row = block_row(record, now)
        replace = {k: row[k] for k in ("nbytes", "checksum", "tier")}
        await connection.execute(
            upsert(connection, blocks)
            .values(**row)
            .on_conflict_do_update(index_elements=[blocks.c.key], set_=replace)
        )


async def recount(connection: AsyncConnection, keys: set[str]) -> list[str]:
    """Recompute reference counts of ``keys``; return the unreferenced (not yet deleted)."""
    orphans = []
    for key in keys:
        count = (
            await connection.execute(
                select(func.count())
                .select_from(agent_blocks)
                .where(agent_blocks.c.block_key == key)
            )
        ).scalar_one()
        await connection.execute(update(blocks).where(blocks.c.key == key).values(ref_count=count))
        if count == 0:
            orphans.append(key)
    return orphans


async def delete_rows(connection: AsyncConnection, keys: Sequence[str]) -> None:
    for start in range(0, len(keys), CHUNK):
        chunk = list(keys[start : start + CHUNK])
        await connection.execute(delete(blocks).where(blocks.c.key.in_(chunk)))


def recounted(namespace: str, agent_id: str) -> Any:
    """Each block the agent holds gets its reference count recomputed in the database."""
    holders = agent_blocks.alias("holders")
    count = (
        select(func.count())
        .select_from(holders)
        .where(holders.c.block_key == blocks.c.key)
        .scalar_subquery()
    )
    held = select(agent_blocks.c.block_key).where(agent_where(agent_blocks, namespace, agent_id))
    return update(blocks).where(blocks.c.key.in_(held)).values(ref_count=count)
