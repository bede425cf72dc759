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
from collections.abc import Callable
from dataclasses import dataclass

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
