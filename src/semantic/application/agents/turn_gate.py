"""Who may run a turn of an agent, and when: one at a time here (its lock) and, with
leases, across the instances sharing the database; each tracked so a delete can end it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager

from semantic.application.agents.keyed_locks import KeyedLocks
from semantic.application.agents.leases import AgentLeases
from semantic.application.agents.live_turns import LiveTurn, LiveTurns
from semantic.application.cache.store import AgentCacheStore
from semantic.domain.errors import AgentDeletedError
from semantic.ports.leases import Lease


class TurnGate:
    def __init__(
        self, cache: AgentCacheStore, turns: LiveTurns, leases: AgentLeases | None
    ) -> None:
        """``leases``: None where this instance is the database's only one (its own locks
        are enough)."""
        self.turns = turns
        self.shared = leases is not None
        self._cache = cache
        self._leases = leases
        self._locks = KeyedLocks()

    @contextlib.asynccontextmanager
    async def turn(
        self, namespace: str, agent_id: str
    ) -> AsyncIterator[tuple[LiveTurn, Lease | None]]:
        """What every turn runs inside: tracked (a delete ends it), one at a time under the
        agent's lock, refused on a full disk before any work, holding the agent's lease."""
        live = LiveTurn(namespace, agent_id)
        with self.turns.tracked(live):
            async with self.lock(namespace, agent_id):
                if live.deleted:
                    raise AgentDeletedError(agent_id, namespace)
                self._cache.check_room()
                async with self.leased(namespace, agent_id) as lease:
                    yield live, lease

    @contextlib.asynccontextmanager
    async def leased(self, namespace: str, agent_id: str) -> AsyncIterator[Lease | None]:
        """The agent's lease (waiting a little for another instance to let it go; else
        ``AgentBusyError``), or None without leases. Taken before the transcript is read,
        so the turn reads what the last holder committed."""
        if self._leases is None:
            yield None
            return
        async with self._leases.holding(namespace, agent_id) as lease:
            yield lease

    def lock(self, namespace: str, agent_id: str) -> AbstractAsyncContextManager[None]:
        return self._locks.hold((namespace, agent_id))
