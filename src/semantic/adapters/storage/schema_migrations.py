"""Bring a metadata database to this release's schema with Alembic, on the store's own
connection, at ``open`` (no ``alembic.ini``: the revisions ship in ``migrations/``).

Databases from before Alembic kept their version in ``schema_version`` (1 to 5); each of
those versions is one of the first five revisions, so such a database is stamped at its
revision and upgraded from there, data in place. The whole upgrade is one transaction: on
PostgreSQL an advisory lock makes instances starting together take turns, and on SQLite an
explicit ``BEGIN IMMEDIATE`` keeps the driver from committing each DDL statement alone.
"""

from __future__ import annotations

import asyncio
import weakref

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from semantic.domain.errors import DataDirectoryUnusableError

SCRIPTS = "semantic.adapters.storage:migrations"
BEFORE_ALEMBIC = {1: "0001", 2: "0002", 3: "0003", 4: "0004", 5: "0005"}
"""A ``schema_version`` of a database from before Alembic, and the revision it equals."""
MIGRATION_LOCK = 0x53454D41  # "SEMA": PostgreSQL's advisory lock id for schema upgrades
_RUNNING: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


async def upgrade_schema(connection: AsyncConnection, shown_url: str) -> bool:
    """``upgrade`` on an async connection, committed. One at a time in a process: Alembic's
    ``context`` and ``op`` are process-wide proxies, and two upgrades interleaving at their
    awaits (two stores opening at once) would run on each other's."""
    running = _RUNNING.setdefault(asyncio.get_running_loop(), asyncio.Lock())
    async with running:
        created = await connection.run_sync(upgrade, shown_url)
        await connection.commit()
    return created


def upgrade(connection: Connection, shown_url: str) -> bool:
    """Upgrade to the newest revision inside the connection's transaction (the caller
    commits); returns whether the database was empty (created now). ``shown_url`` names the
    database in messages, password hidden."""
    if connection.dialect.name == "sqlite":
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    elif connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": MIGRATION_LOCK})
    config = Config()
    config.set_main_option("script_location", SCRIPTS)
    config.attributes["connection"] = connection
    script = ScriptDirectory.from_config(config)
    tables = set(inspect(connection).get_table_names())
    current = MigrationContext.configure(connection).get_current_revision()
    created = current is None
    if current is None and "schema_version" in tables:
        created = _adopt(connection, config, shown_url) == 0
    elif current is not None:
        _check_known(script, current, shown_url)
    command.upgrade(config, "head")
    return created


def head() -> str:
    """The newest revision this release knows."""
    config = Config()
    config.set_main_option("script_location", SCRIPTS)
    found = ScriptDirectory.from_config(config).get_current_head()
    assert found is not None
    return found


def _adopt(connection: Connection, config: Config, shown_url: str) -> int:
    """A database from before Alembic: stamped at the revision its version equals, which
    this returns (0: it never got past creating ``schema_version``)."""
    found = connection.execute(text("SELECT max(version) FROM schema_version")).scalar()
    version = int(found or 0)
    if version > max(BEFORE_ALEMBIC):
        raise DataDirectoryUnusableError(
            f"the metadata database {shown_url} is at schema version {version}, newer than "
            "this release; upgrade semantic or use another --data-dir"
        )
    if version in BEFORE_ALEMBIC:
        command.stamp(config, BEFORE_ALEMBIC[version])
    return version


def _check_known(script: ScriptDirectory, current: str, shown_url: str) -> None:
    try:
        script.get_revision(current)
    except CommandError:
        raise DataDirectoryUnusableError(
            f"the metadata database {shown_url} is at schema revision {current}, which this "
            f"release does not know (its newest is {script.get_current_head()}): it comes "
            "from a newer release; upgrade semantic or use another --data-dir or "
            "--database-url"
        ) from None
