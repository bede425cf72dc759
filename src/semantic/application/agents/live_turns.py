"""The turns and plain requests running for each agent, so deleting the agent can end them.

A delete does not wait minutes for a long reply: it marks the agent's live turns deleted,
cancels their requests, and waits a little for them to end (they keep nothing and say the
agent was deleted). What arrives while a delete is ending the agent is refused at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from semantic.domain.errors import AgentDeletedError, AgentNotFoundError

END_WAIT_S = 5.0
"""How long a delete waits for the turns it ended to finish (a stream whose client reads
nothing may take longer; it keeps nothing anyway)."""


@dataclass(slots=True, eq=False)
class LiveTurn:
    """A turn, or a plain request naming the agent, between its arrival and its end, so a
    delete can end it."""

    namespace: str
    agent_id: str
    request_id: str | None = None
    deleted: bool = False
    ended: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def check(self) -> None:
        """Raises ``AgentDeletedError`` once a delete has ended this turn."""
        if self.deleted:
            raise AgentDeletedError(self.agent_id, self.namespace)


class LiveTurns:
    """Every agent's live turns, and the agents a delete is ending."""

    def __init__(self, cancel: Callable[[str], None]) -> None:
        """``cancel``: ends a queued or running request (``GenerationService.cancel``)."""
        self._cancel = cancel
        self._live: dict[tuple[str, str], set[LiveTurn]] = {}
        self._deleting: set[tuple[str, str]] = set()
        """Agents a delete is ending: what arrives meanwhile is refused, not waited for."""

    @contextlib.contextmanager
    def tracked(self, live: LiveTurn) -> Iterator[None]:
        """``live`` tracked for as long as the block runs."""
        self.track(live)
        try:
            yield
        finally:
            self.untrack(live)

    def track(self, live: LiveTurn) -> None:
        """From now on a delete ends ``live`` (at once, if one is ending the agent now)."""
        key = (live.namespace, live.agent_id)
        live.deleted = key in self._deleting
        self._live.setdefault(key, set()).add(live)

    def untrack(self, live: LiveTurn) -> None:
        """``live`` is over: a delete waiting for it goes on."""
        key = (live.namespace, live.agent_id)
        turns = self._live.get(key, set())
        turns.discard(live)
        if not turns:
            self._live.pop(key, None)
        live.ended.set()

    @contextlib.contextmanager
    def deleting(self, namespace: str, agent_id: str) -> Iterator[None]:
        """One delete at a time ends an agent: of deletes that race, the others are a 404
        (``AgentNotFoundError``), since the first one found it."""
        key = (namespace, agent_id)
        if key in self._deleting:  # another delete is ending it: that one found it
            raise AgentNotFoundError(agent_id, namespace)
        self._deleting.add(key)
        try:
            yield
        finally:
            self._deleting.discard(key)

    async def end(self, namespace: str, agent_id: str) -> bool:
        """End the agent's live turns and wait (up to ``END_WAIT_S``) for them to finish;
        whether there were any."""
        live = list(self._live.get((namespace, agent_id), set()))
        for turn in live:
            turn.deleted = True
            if turn.request_id is not None:
                self._cancel(turn.request_id)
        if live:
            waits = [asyncio.create_task(t.ended.wait()) for t in live]
            _, late = await asyncio.wait(waits, timeout=END_WAIT_S)
            for wait in late:
                wait.cancel()
        return bool(live)
