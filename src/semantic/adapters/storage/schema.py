"""The metadata schema: SQLAlchemy Core tables, and the migrations that create them.

Migrations are plain SQL, frozen per version and applied in order, each in its own
transaction, by ``migrate``; ``schema_version`` records how far a database got. ADR 0006
says why this is not Alembic.
"""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.ext.asyncio import AsyncConnection

metadata = MetaData()

agents = Table(
    "agents",
    metadata,
    Column("namespace", String, primary_key=True),
    Column("agent_id", String, primary_key=True),
    Column("system_prompt", Text),
    Column("anonymous", Boolean, nullable=False),
    Column("token_count", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("last_used", Float, nullable=False),
    Column("keeps_transcript", Boolean, nullable=False),
)

blocks = Table(
    "blocks",
    metadata,
    Column("key", String, primary_key=True),
    Column("parent_key", String, nullable=False),
    Column("namespace", String, nullable=False),
    Column("n_tokens", Integer, nullable=False),
    Column("tokens", LargeBinary, nullable=False),
    Column("nbytes", Integer, nullable=False),
    Column("checksum", String, nullable=False),
    Column("ref_count", Integer, nullable=False),
    Column("tier", String, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("shared", Boolean, nullable=False, default=False),
)

agent_blocks = Table(
    "agent_blocks",
    metadata,
    Column("namespace", String, primary_key=True),
    Column("agent_id", String, primary_key=True),
    Column("position", Integer, primary_key=True),
    Column("block_key", String, ForeignKey("blocks.key"), nullable=False),
)

messages = Table(
    "messages",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("namespace", String, nullable=False),
    Column("agent_id", String, nullable=False),
    Column("role", String, nullable=False),
    Column("content", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("tool_calls", Text),
    Column("tool_call_id", Text),
    Column("raw", Text),
)

generated_replies = Table(
    "generated_replies",
    metadata,
    Column("namespace", String, primary_key=True),
    Column("key", String, primary_key=True),
    Column("body", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)

api_objects = Table(
    "api_objects",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("namespace", String, nullable=False),
    Column("kind", String, nullable=False),
    Column("object_id", String, nullable=False),
    Column("parent_id", String, nullable=False),
    Column("body", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)

agent_leases = Table(
    "agent_leases",
    metadata,
    Column("namespace", String, primary_key=True),
    Column("agent_id", String, primary_key=True),
    Column("holder", String, nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("expires_at", Float, nullable=False),
)
"""One instance per agent at a time: ``holder`` may write the agent's transcript and chain
while ``expires_at`` is ahead and its writes carry ``epoch`` (each taking raises it)."""

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE agents (
            namespace TEXT NOT NULL, agent_id TEXT NOT NULL, system_prompt TEXT,
            anonymous BOOLEAN NOT NULL DEFAULT 0, token_count INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL, last_used REAL NOT NULL,
            PRIMARY KEY (namespace, agent_id))""",
        """CREATE TABLE blocks (
            key TEXT PRIMARY KEY, parent_key TEXT NOT NULL, namespace TEXT NOT NULL,
            n_tokens INTEGER NOT NULL, tokens BLOB NOT NULL, nbytes INTEGER NOT NULL,
            checksum TEXT NOT NULL, ref_count INTEGER NOT NULL DEFAULT 0,
            tier TEXT NOT NULL DEFAULT 'disk', created_at REAL NOT NULL)""",
        "CREATE INDEX blocks_parent ON blocks (parent_key)",
        """CREATE TABLE agent_blocks (
            namespace TEXT NOT NULL, agent_id TEXT NOT NULL, position INTEGER NOT NULL,
            block_key TEXT NOT NULL REFERENCES blocks (key),
            PRIMARY KEY (namespace, agent_id, position))""",
        "CREATE INDEX agent_blocks_key ON agent_blocks (block_key)",
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT, namespace TEXT NOT NULL,
            agent_id TEXT NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL,
            created_at REAL NOT NULL)""",
        "CREATE INDEX messages_agent ON messages (namespace, agent_id, id)",
    ),
    (  # the agents API's agents are marked at creation, not known by their first message
        "ALTER TABLE agents ADD COLUMN keeps_transcript BOOLEAN NOT NULL DEFAULT 0",
        """UPDATE agents SET keeps_transcript = 1
            WHERE system_prompt IS NOT NULL OR EXISTS (SELECT 1 FROM messages
                WHERE messages.namespace = agents.namespace
                AND messages.agent_id = agents.agent_id)""",
    ),
    (  # tool calls and results in transcripts; generated calls kept for round trips
        "ALTER TABLE messages ADD COLUMN tool_calls TEXT",
        "ALTER TABLE messages ADD COLUMN tool_call_id TEXT",
        "ALTER TABLE messages ADD COLUMN raw TEXT",
        """CREATE TABLE generated_replies (
            namespace TEXT NOT NULL, key TEXT NOT NULL, body TEXT NOT NULL,
            created_at REAL NOT NULL, PRIMARY KEY (namespace, key))""",
        "CREATE INDEX generated_replies_age ON generated_replies (created_at)",
    ),
    (  # the Responses API's responses, conversations and their items, as JSON documents
        """CREATE TABLE api_objects (
            seq INTEGER PRIMARY KEY AUTOINCREMENT, namespace TEXT NOT NULL,
            kind TEXT NOT NULL, object_id TEXT NOT NULL, parent_id TEXT NOT NULL DEFAULT '',
            body TEXT NOT NULL, created_at REAL NOT NULL)""",
        "CREATE UNIQUE INDEX api_objects_id ON api_objects (namespace, kind, object_id)",
        "CREATE INDEX api_objects_parent ON api_objects (namespace, kind, parent_id, seq)",
    ),
    (  # scale-out: blocks the shared tier holds, and each agent's lease (one writer at a time)
        "ALTER TABLE blocks ADD COLUMN shared BOOLEAN NOT NULL DEFAULT 0",
        """CREATE TABLE agent_leases (
            namespace TEXT NOT NULL, agent_id TEXT NOT NULL, holder TEXT NOT NULL,
            epoch INTEGER NOT NULL, expires_at REAL NOT NULL,
            PRIMARY KEY (namespace, agent_id))""",
    ),
)
"""MIGRATIONS[n] takes a database from schema version n to n + 1. Never edit one; append."""


async def migrate(connection: AsyncConnection) -> int:
    """Bring the schema to the newest version; returns the version it found (0: a database
    created now)."""
    await connection.execute(
        text("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    )
    row = (await connection.execute(text("SELECT max(version) FROM schema_version"))).scalar()
    current = int(row or 0)
    if current > len(MIGRATIONS):
        raise RuntimeError(
            f"the database is at schema version {current}, newer than this release "
            f"({len(MIGRATIONS)}); upgrade semantic or use another --data-dir"
        )
    for version in range(current, len(MIGRATIONS)):
        for statement in MIGRATIONS[version]:
            await connection.execute(text(statement))
        await connection.execute(
            text("INSERT INTO schema_version (version) VALUES (:v)"), {"v": version + 1}
        )
        await connection.commit()
    return current
