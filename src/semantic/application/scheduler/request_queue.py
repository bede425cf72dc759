"""RequestQueue: bounded, by priority then arrival, with O(1) cancellation.

A heap orders entries by (priority, arrival number); a dict finds any entry by key. Cancel
marks the entry dead and forgets it at once (nothing leaks: the item is handed back to the
caller); the heap drops dead entries lazily as they reach the top. Safe for any number of
producers and one consumer.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from semantic.domain.errors import InvalidRequestError, QueueFullError
from semantic.domain.generation import Priority

T = TypeVar("T")


@dataclass(order=True)
class _Entry(Generic[T]):
    priority: int
    arrival: int
    key: str = field(compare=False)
    item: T = field(compare=False)
    alive: bool = field(default=True, compare=False)


class RequestQueue(Generic[T]):
    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise InvalidRequestError("queue capacity must be positive")
        self.capacity = capacity
        self._heap: list[_Entry[T]] = []
        self._by_key: dict[str, _Entry[T]] = {}
        self._arrivals = itertools.count()
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._closed = False

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_key)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._by_key

    def put(self, key: str, item: T, priority: Priority = Priority.NORMAL) -> None:
        """Queue ``item``; raises ``QueueFullError`` at capacity (the queue never grows)."""
        with self._lock:
            if self._closed or len(self._by_key) >= self.capacity:
                raise QueueFullError(capacity=self.capacity)
            if key in self._by_key:
                raise InvalidRequestError(f"{key} is already queued")
            entry = _Entry(int(priority), next(self._arrivals), key, item)
            heapq.heappush(self._heap, entry)
            self._by_key[key] = entry
            self._ready.notify()

    def cancel(self, key: str) -> T | None:
        """Remove a queued item in O(1); returns it, or None if it was not queued."""
        with self._lock:
            entry = self._by_key.pop(key, None)
            if entry is None:
                return None
            entry.alive = False
            return entry.item

    def peek(self) -> T | None:
        """The item ``pop`` would return, left in place."""
        with self._lock:
            entry = self._head()
            return entry.item if entry else None

    def pop(self) -> T | None:
        with self._lock:
            return self._pop_locked()

    def take(self, timeout: float | None = None) -> T | None:
        """Wait for an item (up to ``timeout`` seconds); None on timeout or after close."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while not self._by_key and not self._closed:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._ready.wait(remaining)
            return self._pop_locked()

    def select(self, max_count: int, budget: int, cost: Callable[[T], int]) -> list[T]:
        """Pop items in order while they fit ``max_count`` and ``budget``; the first that
        does not fit stops the selection (and stays first), so nothing is overtaken."""
        chosen: list[T] = []
        spent = 0
        with self._lock:
            while len(chosen) < max_count:
                entry = self._head()
                if entry is None or spent + cost(entry.item) > budget:
                    break
                spent += cost(entry.item)
                heapq.heappop(self._heap)
                del self._by_key[entry.key]
                chosen.append(entry.item)
        return chosen

    def items(self) -> list[T]:
        """Live items in the order they would be taken."""
        with self._lock:
            return [e.item for e in sorted(self._heap) if e.alive]

    def drain(self) -> list[T]:
        """Close the queue (later puts are refused) and hand back everything in it."""
        with self._lock:
            self._closed = True
            items = [e.item for e in sorted(self._heap) if e.alive]
            self._heap.clear()
            self._by_key.clear()
            self._ready.notify_all()
            return items

    def _head(self) -> _Entry[T] | None:
        while self._heap and not self._heap[0].alive:
            heapq.heappop(self._heap)
        return self._heap[0] if self._heap else None

    def _pop_locked(self) -> T | None:
        entry = self._head()
        if entry is None:
            return None
        heapq.heappop(self._heap)
        del self._by_key[entry.key]
        return entry.item
