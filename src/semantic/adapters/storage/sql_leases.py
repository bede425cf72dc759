"""Agent leases in the metadata database (``agent_leases``), in SQLAlchemy Core that runs
alike on SQLite and PostgreSQL.

Taking is one conditional UPDATE that succeeds only if the row is free (expired), or already
the taker's, raising the epoch when the holder changes; a new agent's row is INSERTed, and
of two inserts that race, the primary key lets one win. Renewing and the fence
(``check_lease``) match holder AND epoch, never the clock: a lease that expired but that
nobody took is still safe to write under, since any taker raises the epoch.

Time is the instance's ``time.time()`` (seconds since the epoch), not the database's:
the database's clock has no dialect-neutral form at sub-second resolution. Instances that
share a database must keep their clocks within a small part of the lease time of each
other (NTP does): a fast clock takes an agent early, and then only the fence stands
between the two, which it does.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import case, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from semantic.adapters.storage.lease_fence import current, lease_row
from semantic.adapters.storage.schema import agent_leases
from semantic.adapters.storage.sql_metadata import unavailable_on_failure
from semantic.domain.errors import AgentBusyError, LeaseLostError
from semantic.ports.leases import Lease


class SqlLeases:
    """``LeaseStore`` on the metadata database (``engine``: the open metadata store's)."""

    def __init__(
        self, engine: Callable[[], AsyncEngine], clock: Callable[[], float] = time.time
    ) -> None:
        self._engine = engine
        self._clock = clock

    @unavailable_on_failure
    async def take(self, namespace: str, agent_id: str, holder: str, seconds: float) -> Lease:
        now = self._clock()
        rows = agent_leases.c
        claim = (
            update(agent_leases)
            .where(
                lease_row(namespace, agent_id), (rows.holder == holder) | (rows.expires_at <= now)
            )
            .values(
                holder=holder,
                expires_at=now + seconds,
                epoch=case((rows.holder == holder, rows.epoch), else_=rows.epoch + 1),
            )
        )
        async with self._engine().begin() as connection:
            if (await connection.execute(claim)).rowcount == 1:
                return Lease(
                    namespace, agent_id, holder, await _epoch(connection, namespace, agent_id)
                )
            expires = await _expiry(connection, namespace, agent_id)
        if expires is not None:
            raise AgentBusyError(agent_id, namespace, max(0.0, expires - now))
        return await self._insert(namespace, agent_id, holder, now + seconds)

    async def _insert(self, namespace: str, agent_id: str, holder: str, expires: float) -> Lease:
        """The agent's first lease; another instance inserting at once wins, this one is
        then busy for the other's lease time."""
        row = {
            "namespace": namespace,
            "agent_id": agent_id,
            "holder": holder,
            "epoch": 1,
            "expires_at": expires,
        }
        try:
            async with self._engine().begin() as connection:
                await connection.execute(insert(agent_leases).values(**row))
        except IntegrityError:
            raise AgentBusyError(agent_id, namespace, expires - self._clock()) from None
        return Lease(namespace, agent_id, holder, 1)

    @unavailable_on_failure
    async def renew(self, lease: Lease, seconds: float) -> None:
        async with self._engine().begin() as connection:
            renewed = await connection.execute(
                update(agent_leases)
                .where(current(lease))
                .values(expires_at=self._clock() + seconds)
            )
            if renewed.rowcount != 1:
                raise LeaseLostError(lease.agent_id, lease.namespace)

    @unavailable_on_failure
    async def release(self, lease: Lease) -> None:
        """Expire it now. The row stays while the agent does, so its epoch keeps rising; a
        delete under the lease removes it (``delete_agent``): a holder of an older lease
        then finds no row. A new agent of that id starts again at epoch 1; an instance
        takes it only once none of its requests holds the old lease (they share one,
        ``AgentLeases.holding``), so no old lease can match the new row."""
        async with self._engine().begin() as connection:
            await connection.execute(
                update(agent_leases).where(current(lease)).values(expires_at=0.0)
            )


async def _epoch(connection: AsyncConnection, namespace: str, agent_id: str) -> int:
    found = await connection.execute(
        select(agent_leases.c.epoch).where(lease_row(namespace, agent_id))
    )
    return int(found.scalar_one())


async def _expiry(connection: AsyncConnection, namespace: str, agent_id: str) -> float | None:
    found = await connection.execute(
        select(agent_leases.c.expires_at).where(lease_row(namespace, agent_id))
    )
    value = found.scalar()
    return None if value is None else float(value)
