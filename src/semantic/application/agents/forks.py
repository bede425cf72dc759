"""An agent's fork and delete: each is one transaction on the metadata, taken under the
agents' locks and leases (``turn_gate``), and a delete first ends the turns it would
otherwise race (``live_turns``)."""

from __future__ import annotations

import functools

from semantic.application.agents.turn_gate import TurnGate
from semantic.application.cache.lineage import branch_prefix
from semantic.application.cache.store import AgentCacheStore
from semantic.domain.errors import AgentNotFoundError
from semantic.ports.metadata_store import AgentRecord, AgentRecords


class AgentForks:
    """Forks and deletes of the agents of every namespace."""

    def __init__(self, gate: TurnGate, cache: AgentCacheStore, agent_records: AgentRecords) -> None:
        self._gate = gate
        self._turns = gate.turns
        self._cache = cache
        self._agent_records = agent_records

    async def fork(self, namespace: str, source_id: str, new_id: str) -> None:
        """A new agent sharing every block and message of the source: nothing is copied but
        ids, and the two diverge from their next turn on. One transaction (the block list,
        the reference counts, a copy of the message rows), so a crash leaves no half-made
        fork."""
        async with self._gate.lock(namespace, source_id), self._gate.leased(namespace, new_id):
            source = await self._agent_records.agent(namespace, source_id)
            if source is None or source.anonymous:
                raise AgentNotFoundError(source_id, namespace)
            write = functools.partial(
                self._agent_records.fork_agent, namespace, source_id, new_id, source.system_prompt
            )
            made: AgentRecord | None = await self._cache.keeping(namespace, new_id, write)
            if made is None:
                raise AgentNotFoundError(source_id, namespace)

    async def delete(self, namespace: str, agent_id: str) -> None:
        """Ends the agent's queued and running turns and plain requests first (they keep
        nothing and say the agent was deleted), rather than waiting minutes for a long reply
        to finish, and waits for them, so one that finished first has committed what it
        saves before the agent is deleted. Of deletes that race, only the first finds the
        agent (the others are a 404); an agent whose first request was still running is
        found too."""
        with self._turns.deleting(namespace, agent_id):
            await self._delete(namespace, agent_id)

    async def _delete(self, namespace: str, agent_id: str) -> None:
        live = await self._turns.end(namespace, agent_id)
        self._cache.retention.forget(namespace, agent_id)
        # Saves still queued (of one that finished first, or of a plain request whose
        # client left while its save waited) would bring the agent back after the delete.
        await self._cache.flush()
        async with (
            self._gate.lock(namespace, agent_id),
            self._gate.leased(namespace, agent_id) as lease,
        ):
            record = await self._agent_records.agent(namespace, agent_id)
            if record is None or record.anonymous:
                if live:  # its first requests were running: they are ended, nothing kept
                    return
                raise AgentNotFoundError(agent_id, namespace)
            delete = self._agent_records.delete_agent
            orphans = await self._cache.keeping(
                namespace, agent_id, functools.partial(delete, namespace, agent_id, lease=lease)
            )
            for branch in await self._agent_records.agents(namespace):
                if branch.agent_id.startswith(branch_prefix(agent_id)):
                    orphans += await self._agent_records.delete_agent(namespace, branch.agent_id)
        await self._cache.forget(orphans)
