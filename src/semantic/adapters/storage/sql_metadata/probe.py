"""The metadata database asked a trivial question: is it there (``ports.probe``)?"""

from __future__ import annotations

from sqlalchemy import text

from semantic.adapters.storage.sql_metadata.failures import unavailable_on_failure
from semantic.adapters.storage.sql_metadata.store import SqlMetadataStore


class DatabaseProbe:
    """``SELECT 1`` on the store's engine: on PostgreSQL a round trip and a pooled
    connection checked; on SQLite in the data directory, the file still opens."""

    def __init__(self, store: SqlMetadataStore) -> None:
        self.path = store.path  # named by a full disk's error
        self._store = store

    @unavailable_on_failure
    async def ping(self) -> None:
        async with self._store.engine().connect() as connection:
            await connection.execute(text("SELECT 1"))
