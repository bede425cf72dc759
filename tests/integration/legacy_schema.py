"""The schema as releases before Alembic created it: frozen SQL per ``schema_version``, to
build old databases by hand and check that they upgrade in place."""

from __future__ import annotations

import sqlite3
from pathlib import Path

BEFORE_ALEMBIC: tuple[tuple[str, ...], ...] = (
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
"""BEFORE_ALEMBIC[n] took a database from version n to n + 1."""


def old_database(path: Path, version: int) -> sqlite3.Connection:
    """A database as the release at schema ``version`` left it (the caller closes it)."""
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    for n in range(version):
        for statement in BEFORE_ALEMBIC[n]:
            raw.execute(statement)
        raw.execute("INSERT INTO schema_version (version) VALUES (?)", (n + 1,))
    raw.commit()
    return raw
