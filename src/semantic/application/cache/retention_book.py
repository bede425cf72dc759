"""Each agent's retention hints as the memory tier applies them (ADR 0028).

The hints live on the agent's record (the database, so they outlive a restart); this book
keeps the ones in use where the engine thread can read them when it adopts a finished
request's blocks, without I/O. A block carries the hints of the agents that used it: the
highest priority, a pin if any of them pinned it, and the latest TTL deadline, none if any
of them keeps it without one.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from semantic.domain.retention import DEFAULT_PRIORITY, Retention


@dataclass(frozen=True, slots=True)
class BlockHint:
    priority: int = DEFAULT_PRIORITY
    expires_at: float = math.inf
    """Monotonic time it may stay in memory until; ``inf``: no TTL."""
    pinned: bool = False


class RetentionBook:
    """Thread-safe: the event loop sets hints, the engine thread reads them."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._agents: dict[tuple[str, str], Retention] = {}

    def set(self, namespace: str, agent_id: str, retention: Retention) -> None:
        with self._lock:
            if retention.is_default:
                self._agents.pop((namespace, agent_id), None)
            else:
                self._agents[(namespace, agent_id)] = retention

    def forget(self, namespace: str, agent_id: str) -> None:
        with self._lock:
            self._agents.pop((namespace, agent_id), None)

    def hint(self, namespace: str, agent_id: str) -> BlockHint:
        """What a use of the agent's blocks now gives them."""
        with self._lock:
            retention = self._agents.get((namespace, agent_id), Retention())
        ttl = retention.ttl_seconds
        expires = math.inf if ttl is None else self._clock() + ttl
        return BlockHint(retention.priority, expires, retention.pinned)


class HintedBlock(Protocol):
    """What the eviction order reads of a hot block."""

    priority: int
    expires_at: float | None
    pinned: bool
    last_used: float
    held_until: float


B = TypeVar("B", bound=HintedBlock)
EvictionOrder = Callable[[Sequence[B], float], list[B]]


def lru_order(blocks: Sequence[B], now: float) -> list[B]:  # noqa: ARG001 (an EvictionOrder)
    """``--eviction lru``: least recently used first, hints ignored (the baseline)."""
    return sorted(blocks, key=lambda block: block.last_used)


def agent_order(blocks: Sequence[B], now: float) -> list[B]:
    """Unpinned before pinned; past their TTL, then without one, then within it or held
    for a tool wait; low priority before high; then least recently used."""

    def rank(block: HintedBlock) -> tuple[bool, int, int, float]:
        held = block.held_until > now  # its agent's tool results are due
        keep = 2 if held else _keep(block.expires_at, now)
        return (block.pinned, keep, block.priority, block.last_used)

    return sorted(blocks, key=rank)


def _keep(expires: float | None, now: float) -> int:
    """0: past its TTL; 1: no TTL (kept till memory is short); 2: within its TTL."""
    if expires is None or math.isinf(expires):
        return 1
    return 2 if expires > now else 0
