"""The metadata store on SQLite (WAL, aiosqlite) or PostgreSQL (asyncpg), through
SQLAlchemy 2's asyncio API; ``sql_engines`` holds what differs between the two.

``store`` is the port's face (transactions, the lease fence, the in-memory copy of the
blocks table); the SQL is split by table group: ``agent_table`` (agents and their block
lists), ``block_table`` (blocks and reference counts), ``transcripts`` (messages),
``replies`` (generated replies kept for their round trip); ``opening`` opens either
database, ``failures`` maps its failures to the domain's errors, ``probe`` asks it
whether it answers (readiness). (Named
``SqliteMetadataStore`` in ``sqlite_metadata`` until 2026-11-26.)"""

from semantic.adapters.storage.sql_metadata.failures import unavailable_on_failure
from semantic.adapters.storage.sql_metadata.probe import DatabaseProbe
from semantic.adapters.storage.sql_metadata.replies import REPLIES_KEPT_S
from semantic.adapters.storage.sql_metadata.store import SqlMetadataStore

__all__ = ["REPLIES_KEPT_S", "DatabaseProbe", "SqlMetadataStore", "unavailable_on_failure"]
