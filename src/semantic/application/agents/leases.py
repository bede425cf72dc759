"""One instance per agent at a time: this instance's side of the agents' leases.

A turn holds its agent's lease from before its prompt is read to after its reply is
committed (``AgentLeases.holding``): it waits a little for a lease another instance holds
(``AgentBusyError`` after ``wait_s``), renews it every ``renew_s`` while it runs, and lets
it go at the end, so the agent's next turn may land on any instance at once. Every write of
the agent's chain or transcript carries the lease (``held``), and the store refuses it once
another instance has taken the agent (ADR 0025).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from semantic.application.agents.keyed_locks import KeyedLocks
from semantic.domain.errors import AgentBusyError, LeaseLostError, StorageUnavailableError
from semantic.ports.leases import Lease, LeaseStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    seconds: float = 30.0
    """How long a lease lasts unless renewed: how long an agent of a dead (or paused)
    instance waits before another instance may take it."""
    wait_s: float = 5.0
    """How long a request waits for a lease another instance holds before its 409."""
    first_poll_s: float = 0.05
    """The first wait between tries; each one doubles, up to ``max_poll_s``."""
    max_poll_s: float = 0.5

    @property
    def renew_s(self) -> float:
        """A third of the lease: two renewals may fail (a slow database) before it ends."""
        return self.seconds / 3

    def __post_init__(self) -> None:
        if not (self.seconds > 0 and self.wait_s >= 0):
            raise ValueError("a lease needs seconds > 0 and wait_s >= 0")


def instance_holder() -> str:
    """This instance's name in the lease table: host, process and a random part (a pid
    comes back after a restart; a lease of the dead process must not be taken for ours)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(eq=False)
class _Held:
    lease: Lease
    users: int = 1
    renewing: asyncio.Task[None] | None = field(default=None, repr=False)


class AgentLeases:
    def __init__(
        self,
        store: LeaseStore,
        holder: str,
        config: LeaseConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        pause: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``clock`` and ``pause``: how the wait for a busy lease is timed and passes
        (tests pass fakes); renewals run on asyncio's own clock."""
        self._store = store
        self.holder = holder
        self._config = config or LeaseConfig()
        self._clock = clock
        self._pause = pause
        self._held: dict[tuple[str, str], _Held] = {}
        self._entering = KeyedLocks()

    def held(self, namespace: str, agent_id: str) -> Lease | None:
        """The lease this instance's turns of the agent write under (None: not held)."""
        held = self._held.get((namespace, agent_id))
        return None if held is None else held.lease

    @contextlib.asynccontextmanager
    async def holding(self, namespace: str, agent_id: str) -> AsyncIterator[Lease]:
        """The agent's lease while the block runs; shared by this instance's requests of
        the agent that overlap, let go when the last one ends."""
        key = (namespace, agent_id)
        async with self._entering.hold(key):
            held = self._held.get(key)
            if held is None:
                held = _Held(await self._take(namespace, agent_id))
                held.renewing = asyncio.create_task(self._renew(held), name="semantic-lease")
                self._held[key] = held
            else:
                held.users += 1
        try:
            yield held.lease
        finally:
            held.users -= 1
            if held.users == 0:
                del self._held[key]
                await self._let_go(held)

    async def _take(self, namespace: str, agent_id: str) -> Lease:
        """Tries until ``wait_s`` has passed, waiting longer each time (never past the
        deadline); the last refusal says how long the other lease has left."""
        deadline = self._clock() + self._config.wait_s
        pause = self._config.first_poll_s
        while True:
            try:
                return await self._store.take(
                    namespace, agent_id, self.holder, self._config.seconds
                )
            except AgentBusyError:
                left = deadline - self._clock()
                if left <= 0:
                    raise
            await self._pause(min(pause, left))
            pause = min(pause * 2, self._config.max_poll_s)

    async def _renew(self, held: _Held) -> None:
        """Until cancelled. A lost lease stops it (the fenced writes will be refused); a
        database that fails for a moment does not, the lease lasts two more tries."""
        while True:
            await asyncio.sleep(self._config.renew_s)
            try:
                await self._store.renew(held.lease, self._config.seconds)
            except LeaseLostError:
                log.warning(
                    "lost the lease of agent %s/%s to another instance",
                    held.lease.namespace,
                    held.lease.agent_id,
                )
                return
            except StorageUnavailableError as error:
                log.warning("renewing a lease failed (%s); trying again", error)

    async def _let_go(self, held: _Held) -> None:
        if held.renewing is not None:
            held.renewing.cancel()
            await asyncio.gather(held.renewing, return_exceptions=True)
        try:
            await self._store.release(held.lease)
        except StorageUnavailableError as error:  # it expires on its own
            log.warning("releasing a lease failed (%s); it will expire", error)
