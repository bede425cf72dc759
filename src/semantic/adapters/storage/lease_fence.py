"""The fence every write of an agent's transcript or chain passes first (ADR 0025)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncConnection

from semantic.adapters.storage.schema import agent_leases
from semantic.domain.errors import LeaseLostError
from semantic.ports.leases import Lease


async def check_lease(connection: AsyncConnection, lease: Lease | None) -> None:
    """The fence: first in a write's transaction, raises ``LeaseLostError`` (and the write
    rolls back) unless the lease row still has the lease's holder and epoch. It is an
    UPDATE, not a SELECT, so it locks the row (PostgreSQL) or the database (SQLite) until
    the write commits: no taker can raise the epoch between the check and the commit.
    ``None``: no leases (one instance), no check."""
    if lease is None:
        return
    checked = await connection.execute(
        update(agent_leases).where(current(lease)).values(epoch=agent_leases.c.epoch)
    )
    if checked.rowcount != 1:
        raise LeaseLostError(lease.agent_id, lease.namespace)


def lease_row(namespace: str, agent_id: str) -> Any:
    return (agent_leases.c.namespace == namespace) & (agent_leases.c.agent_id == agent_id)


def current(lease: Lease) -> Any:
    """The lease row while it still has this holder and epoch."""
    return (
        lease_row(lease.namespace, lease.agent_id)
        & (agent_leases.c.holder == lease.holder)
        & (agent_leases.c.epoch == lease.epoch)
    )
