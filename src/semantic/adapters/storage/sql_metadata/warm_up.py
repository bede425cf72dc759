"""The reads of a returning agent's turn, made once when the database opens.

SQLAlchemy compiles a statement, and builds its rows' processors, the first time it runs;
after a restart that cost the first turn of a chain ~2 ms before its prompt could render
(ADR 0020). Run here on an id no agent can have, they find nothing and change nothing."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection

from semantic.adapters.storage.sql_metadata import transcripts
from semantic.adapters.storage.sql_metadata.agent_table import agent_keys, read_agent

NOBODY = "~warm-up"
"""No client's namespace or agent id starts with ``~``."""


async def warm_up_reads(connection: AsyncConnection) -> None:
    await read_agent(connection, NOBODY, NOBODY)
    await agent_keys(connection, NOBODY, NOBODY)
    await transcripts.messages_of(connection, NOBODY, NOBODY)
