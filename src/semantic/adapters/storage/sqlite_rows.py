"""SQLite rows and the records they hold, and each connection's settings."""

from __future__ import annotations

from array import array
from typing import Any

from sqlalchemy.engine import Row

from semantic.adapters.storage.block_rows import BlockRow
from semantic.ports.metadata_store import AgentRecord, BlockRecord

QUARANTINED = "quarantined"
"""A block row's tier once its file failed verification."""


def configure_connection(dbapi_connection: Any, _record: Any) -> None:
    """WAL so lookups never wait for the writer; a full sync so an acknowledged turn survives
    power loss (ADR 0006); a busy timeout so a checkpoint does not fail a write."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


def agent_row(agent: AgentRecord, now: float) -> dict[str, Any]:
    return {
        "namespace": agent.namespace,
        "agent_id": agent.agent_id,
        "system_prompt": agent.system_prompt,
        "anonymous": agent.anonymous,
        "token_count": agent.token_count,
        "created_at": now,
        "last_used": agent.last_used or now,
        "keeps_transcript": agent.keeps_transcript,
        "context_policy": agent.context_policy,
        "forked_from": agent.forked_from,
        "retention": agent.retention,
    }


def block_row(record: BlockRecord, now: float) -> dict[str, Any]:
    return {
        "key": record.key,
        "parent_key": record.parent_key,
        "namespace": record.namespace,
        "n_tokens": record.n_tokens,
        "tokens": array("I", record.tokens).tobytes(),
        "nbytes": record.nbytes,
        "checksum": record.checksum,
        "ref_count": 0,
        "tier": "disk",
        "created_at": now,
    }


def block_row_of(row: Row[Any]) -> BlockRow:
    return BlockRow(
        row.key,
        row.parent_key,
        row.namespace,
        bytes(row.tokens),
        row.nbytes,
        row.checksum,
        row.ref_count,
        row.tier == QUARANTINED,
    )


def agent_of(row: Row[Any], keys: list[str]) -> AgentRecord:
    return AgentRecord(
        row.namespace,
        row.agent_id,
        tuple(keys),
        row.token_count,
        row.system_prompt,
        bool(row.anonymous),
        row.created_at,
        row.last_used,
        bool(row.keeps_transcript),
        row.context_policy,
        row.forked_from,
        row.retention,
    )
