"""Plain (OpenAI or Anthropic) requests that name an agent: tracked like a turn, so
deleting the agent ends them and they keep nothing; with leases they hold the agent's
lease till they end, as a turn does."""

from __future__ import annotations

import asyncio
import contextlib
import functools

from semantic.application.agents.live_turns import LiveTurn
from semantic.application.agents.turn_gate import TurnGate
from semantic.application.cache.retention_book import RetentionBook
from semantic.application.chat.generation import (
    GenerationHandle,
    GenerationInput,
    GenerationService,
)
from semantic.domain.errors import AgentDeletedError, AgentKeepsTranscriptError
from semantic.domain.retention import Retention
from semantic.ports.metadata_store import AgentRecords


class PlainRequests:
    def __init__(
        self,
        generation: GenerationService,
        agent_records: AgentRecords,
        gate: TurnGate,
        book: RetentionBook,
    ) -> None:
        self._generation = generation
        self._book = book
        self._agent_records = agent_records
        self._gate = gate
        self._letting_go: set[asyncio.Future[None]] = set()
        """Leases of plain requests being released (kept referenced till they are)."""

    async def start(self, request: GenerationInput) -> GenerationHandle:
        """``AgentBusyError`` if another instance keeps the agent's lease past the wait."""
        if request.agent_id is None:
            return await self._generation.start(request)
        await self.check_use(request.namespace, request.agent_id)
        live = LiveTurn(request.namespace, request.agent_id)
        turns = self._gate.turns
        turns.track(live)
        if live.deleted:
            turns.untrack(live)
            raise AgentDeletedError(request.agent_id, request.namespace)
        lease = contextlib.AsyncExitStack()
        try:
            await lease.enter_async_context(self._gate.leased(request.namespace, request.agent_id))
            handle = await self._generation.start(
                request, check=live.check, on_end=functools.partial(self._end, live, lease)
            )
        except BaseException:
            await lease.aclose()
            turns.untrack(live)
            raise
        live.request_id = handle.request_id
        return handle

    def _end(self, live: LiveTurn, lease: contextlib.AsyncExitStack) -> None:
        """The request is over: its save was fenced by the lease it held (taken when it
        started, like a turn's), which goes now."""
        self._gate.turns.untrack(live)
        if self._gate.shared:
            letting_go = asyncio.ensure_future(lease.aclose())
            self._letting_go.add(letting_go)
            letting_go.add_done_callback(self._letting_go.discard)

    async def check_use(self, namespace: str, agent_id: str) -> None:
        """A plain request may name any agent but one whose transcript this server keeps,
        from its creation on: its reply's KV would take the place of the transcript's."""
        record = await self._agent_records.agent(namespace, agent_id)
        if record is not None and record.keeps_transcript:
            raise AgentKeepsTranscriptError(agent_id)
        if record is not None:  # its hints, for its blocks when the request ends
            self._book.set(namespace, agent_id, Retention.from_json(record.retention))
