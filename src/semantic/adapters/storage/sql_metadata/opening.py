"""Opening the metadata database: the embedded SQLite file (its blocks table read into
memory) or a shared PostgreSQL server, the schema created or upgraded either way."""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.exc import DatabaseError, DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from semantic.adapters.storage.block_rows import BlockRow
from semantic.adapters.storage.schema import blocks
from semantic.adapters.storage.schema_migrations import upgrade_schema
from semantic.adapters.storage.sql_engines import create_engine, shown
from semantic.adapters.storage.sqlite_rows import block_row_of
from semantic.domain.errors import DataDirectoryUnusableError, StorageUnavailableError

log = logging.getLogger(__name__)


async def open_embedded(path: Path, url: str) -> tuple[AsyncEngine, bool, list[BlockRow]]:
    """The engine, whether the schema was created, and the blocks table's rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url)
    try:
        async with engine.connect() as connection:
            created = await upgrade_schema(connection, shown(url))
            rows = [block_row_of(row) for row in await connection.execute(select(blocks))]
    except DatabaseError as error:
        await engine.dispose()
        if isinstance(error, OperationalError):  # locked, a full disk...: not the file
            raise
        raise DataDirectoryUnusableError(
            f"the metadata database {path} cannot be read ({error.orig}); move it "
            "aside to start with an empty one (the block files beside it are then set "
            "aside too)"
        ) from error
    except BaseException:  # a database from a newer release, refused
        await engine.dispose()
        raise
    return engine, created, rows


async def open_shared(url: str) -> tuple[AsyncEngine, bool]:
    """A database server: out of reach, or refusing us, is said with its URL (password
    hidden), and the server exits with that line, no traceback."""
    engine = create_engine(url)
    try:
        async with engine.connect() as connection:
            created = await upgrade_schema(connection, shown(url))
    except (DBAPIError, OSError, TimeoutError) as error:
        await engine.dispose()
        reason = getattr(error, "orig", None) or error
        raise StorageUnavailableError(
            f"cannot use the metadata database {shown(url)}: {reason}"
        ) from error
    except BaseException:
        await engine.dispose()
        raise
    log.info("metadata in %s", shown(url))
    return engine, created
