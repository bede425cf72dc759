"""The lease port: one instance per agent at a time, across instances sharing a database.

A lease names its holder (an instance) and an epoch that rises each time the agent changes
hands. Every write of the agent's transcript or chain carries the ``Lease`` it was made
under; the store refuses it (``LeaseLostError``) once the epoch is no longer current, so an
instance that was paused past its lease cannot commit over the one that took the agent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Lease:
    """What a fenced write carries: the writes commit only while the lease row still has
    this holder and epoch."""

    namespace: str
    agent_id: str
    holder: str
    epoch: int


class LeaseStore(Protocol):
    async def take(self, namespace: str, agent_id: str, holder: str, seconds: float) -> Lease:
        """The agent's lease for ``seconds``, if it is free, expired or already
        ``holder``'s (the epoch rises when it changes hands); else ``AgentBusyError`` with
        how long the other holder's lease has left."""
        ...

    async def renew(self, lease: Lease, seconds: float) -> None:
        """Extend ``lease`` to ``seconds`` from now; ``LeaseLostError`` if it is no longer
        current (another holder took the agent)."""
        ...

    async def release(self, lease: Lease) -> None:
        """Let the agent go now (no error if the lease was already lost)."""
        ...
