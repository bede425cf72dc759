"""The metadata database's engine, SQLite in the data directory or PostgreSQL by URL, and
what differs between the two: connection settings, the pool, the upserting insert.

SQLite is embedded: one process owns the file (the data directory's lock), so the store may
keep a copy of the blocks table in memory. PostgreSQL is shared by every instance of a
cluster: nothing read from it stays valid after the transaction that read it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Table, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from semantic.adapters.storage.sqlite_rows import configure_connection

CONNECT_TIMEOUT_S = 10.0
"""How long a new PostgreSQL connection may take before the request gets a 503."""
STATEMENT_TIMEOUT_S = 60.0
"""A statement that takes longer (a server that stopped answering) fails as unavailable."""


def sqlite_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


def shown(url: str | URL) -> str:
    """The URL as messages may show it: the password hidden."""
    return make_url(url).render_as_string(hide_password=True)


def is_sqlite(url: str | URL) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def create_engine(url: str) -> AsyncEngine:
    """SQLite: WAL and a full sync on every connection (``configure_connection``).
    PostgreSQL: connections checked before use, so a server restarted since costs a
    reconnect rather than a failed request, and bounded waits (``CONNECT_TIMEOUT_S``)."""
    if is_sqlite(url):
        engine = create_async_engine(url, pool_size=4)
        event.listen(engine.sync_engine, "connect", configure_connection)
        return engine
    return create_async_engine(
        url,
        pool_size=8,
        max_overflow=8,
        pool_pre_ping=True,
        pool_recycle=1800,
        connect_args={"timeout": CONNECT_TIMEOUT_S, "command_timeout": STATEMENT_TIMEOUT_S},
    )


def upsert(connection: AsyncConnection, table: Table) -> Any:
    """``INSERT`` with ``on_conflict_do_update``/``_nothing`` in the connection's dialect
    (both dialects spell them alike)."""
    if connection.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)
