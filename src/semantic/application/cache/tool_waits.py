"""How long an agent's tools take, learned from the gaps seen (ADR 0028).

A reply that ends in tool calls leaves its agent waiting for the results; the turn that
brings them continues the same conversation, so its KV is worth keeping in memory for that
long and no longer. Each (namespace, agent, tool) keeps a moving average of the gaps seen
between a reply calling the tool and the next turn; a tool not seen yet is expected to take
``FIRST_GUESS_S``. The hold is that long, doubled for the slow tail, and capped.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Final

FIRST_GUESS_S: Final = 10.0
CAP_S: Final = 600.0
WEIGHT: Final = 0.3
"""Of the newest gap in the average: a tool that got slower shows within a few calls."""
MAX_KEPT: Final = 10_000


class ToolWaits:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._average: OrderedDict[tuple[str, str, str], float] = OrderedDict()
        self._waiting: dict[tuple[str, str], tuple[float, tuple[str, ...]]] = {}
        self._due: dict[tuple[str, str], float] = {}

    def started(self, namespace: str, agent_id: str, tools: Sequence[str]) -> float:
        """The agent's reply called ``tools``: until when to hold its KV (monotonic)."""
        now = self._clock()
        with self._lock:
            self._waiting[(namespace, agent_id)] = (now, tuple(tools))
            expected = max(
                (self._average.get((namespace, agent_id, tool), FIRST_GUESS_S) for tool in tools),
                default=FIRST_GUESS_S,
            )
            self._due[(namespace, agent_id)] = now + expected
            for waits in (self._waiting, self._due):  # agents that never came back
                while len(waits) > MAX_KEPT:
                    waits.pop(next(iter(waits)))
        return now + min(CAP_S, 2 * expected)

    def due_in(self, namespace: str, agent_id: str) -> float | None:
        """Seconds until the agent's tool results are expected (negative: overdue; None:
        it waits on none), for the disk's eviction order."""
        with self._lock:
            due = self._due.get((namespace, agent_id))
        return None if due is None else due - self._clock()

    def returned(self, namespace: str, agent_id: str) -> None:
        """The agent's next turn came: the gap joins each called tool's average."""
        now = self._clock()
        with self._lock:
            waited = self._waiting.pop((namespace, agent_id), None)
            self._due.pop((namespace, agent_id), None)
            if waited is None:
                return
            since, tools = waited
            gap = min(CAP_S, now - since)
            for tool in tools:
                key = (namespace, agent_id, tool)
                before = self._average.pop(key, None)
                self._average[key] = gap if before is None else before + WEIGHT * (gap - before)
            while len(self._average) > MAX_KEPT:
                self._average.popitem(last=False)

    def expected(self, namespace: str, agent_id: str, tool: str) -> float | None:
        """The average gap seen for the tool (None: not seen yet)."""
        with self._lock:
            return self._average.get((namespace, agent_id, tool))
