"""The metadata schema: SQLAlchemy Core tables, the same on SQLite and PostgreSQL.

Alembic's revisions in ``migrations/versions`` create them and ``schema_migrations`` runs
those when a store opens (ADR 0021); a change here needs a new revision there.
"""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Column,
    Double,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

agents = Table(
    "agents",
    metadata,
    Column("namespace", String, primary_key=True),
    Column("agent_id", String, primary_key=True),
    Column("system_prompt", Text),
    Column("anonymous", Boolean, nullable=False),
    Column("token_count", Integer, nullable=False),
    Column("created_at", Double, nullable=False),
    Column("last_used", Double, nullable=False),
    Column("keeps_transcript", Boolean, nullable=False),
    Column("context_policy", Text),
    Column("forked_from", String),
    Column("retention", Text),
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
    Column("created_at", Double, nullable=False),
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
    Column("created_at", Double, nullable=False),
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
    Column("created_at", Double, nullable=False),
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
    Column("created_at", Double, nullable=False),
)

agent_leases = Table(
    "agent_leases",
    metadata,
    Column("namespace", String, primary_key=True),
    Column("agent_id", String, primary_key=True),
    Column("holder", String, nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("expires_at", Double, nullable=False),
)
"""One instance per agent at a time: ``holder`` may write the agent's transcript and chain
while ``expires_at`` is ahead and its writes carry ``epoch`` (each taking raises it)."""
