"""What goes first when a tier is short of room: one policy for memory and disk (ADR 0028).

``--eviction agent`` (the default) ranks by what the agents said and do:
1. unpinned before pinned (on disk a pin is never cut but by its namespace's quota);
2. past their TTL, then without one, then within it or due back from a tool wait;
3. low priority before high;
4. expected back latest first: an agent waiting on its tools is due when they are expected
   to return (``ToolWaits``); any other is expected to stay away as long again as it has
   been away already (so among themselves, least recently used first: in agent traces the
   longer an agent has been quiet, the longer it tends to stay so).

``--eviction lru`` ranks by recency alone (a pin still holds on disk): the baseline the
trace benchmark compares against.

Memory ranks hot blocks, which carry their users' merged hints (``HotIndex.retain``); the
disk ranks agents' records, which carry their own (``AgentRecord.retention``) and whose
tool waits the policy asks ``ToolWaits`` about. Memory's clock is monotonic, the records'
is the wall's: each order takes the one its tier keeps.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from semantic.domain.retention import Retention
from semantic.ports.metadata_store import AgentRecord


class HintedBlock(Protocol):
    """What the order reads of a hot block."""

    priority: int
    expires_at: float | None
    pinned: bool
    last_used: float
    held_until: float


B = TypeVar("B", bound=HintedBlock)
EvictionOrder = Callable[[Sequence[B], float], list[B]]
"""Hot blocks, first to go first, at ``now`` (monotonic)."""
RecordOrder = Callable[[Sequence[AgentRecord]], list[AgentRecord]]
"""Agents' records, first to be cut first (pinned ones last)."""


class DueBack(Protocol):
    """When an agent's tool results are expected (``ToolWaits``)."""

    def due_in(self, namespace: str, agent_id: str) -> float | None: ...


def lru_order(blocks: Sequence[B], now: float) -> list[B]:  # noqa: ARG001 (an EvictionOrder)
    """``--eviction lru``: least recently used first, hints ignored."""
    return sorted(blocks, key=lambda block: block.last_used)


def agent_order(blocks: Sequence[B], now: float) -> list[B]:
    """``--eviction agent`` for memory (the module's ranking)."""

    def rank(block: HintedBlock) -> tuple[bool, int, int, float]:
        held = block.held_until > now  # its agent's tool results are due
        keep = 2 if held else _keep(block.expires_at, now)
        back = block.held_until if held else _back(block.last_used, now)
        return (block.pinned, keep, block.priority, -back)

    return sorted(blocks, key=rank)


def lru_records(records: Sequence[AgentRecord]) -> list[AgentRecord]:
    """``--eviction lru`` for the disk: least recently used first, pinned ones last."""
    return sorted(records, key=lambda r: (Retention.from_json(r.retention).pinned, r.last_used))


class AgentRecordOrder:
    """``--eviction agent`` for the disk (the module's ranking)."""

    def __init__(self, due: DueBack, wall: Callable[[], float] = time.time) -> None:
        self._due = due
        self._wall = wall

    def __call__(self, records: Sequence[AgentRecord]) -> list[AgentRecord]:
        now = self._wall()

        def rank(record: AgentRecord) -> tuple[bool, int, int, float]:
            hints = Retention.from_json(record.retention)
            due = self._due.due_in(record.namespace, record.agent_id)
            held = due is not None and due > 0
            ttl = hints.ttl_seconds
            keep = 2 if held else _keep(None if ttl is None else record.last_used + ttl, now)
            back = now + due if held and due is not None else _back(record.last_used, now)
            return (hints.pinned, keep, hints.priority, -back)

        return sorted(records, key=rank)


def _back(last_used: float, now: float) -> float:
    """When an agent not waiting on a tool is expected back: as long again as it has been
    away."""
    return now + max(0.0, now - last_used)


def _keep(expires: float | None, now: float) -> int:
    """0: past its TTL; 1: no TTL (kept till the tier is short); 2: within its TTL."""
    if expires is None or math.isinf(expires):
        return 1
    return 2 if expires > now else 0
