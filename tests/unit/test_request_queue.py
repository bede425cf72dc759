from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from semantic.application.scheduler.request_queue import RequestQueue
from semantic.domain.errors import QueueFullError
from semantic.domain.generation import Priority


def test_high_priority_overtakes_normal_and_ties_keep_arrival_order() -> None:
    queue: RequestQueue[str] = RequestQueue(10)
    queue.put("n1", "n1", Priority.NORMAL)
    queue.put("l1", "l1", Priority.LOW)
    queue.put("n2", "n2", Priority.NORMAL)
    queue.put("h1", "h1", Priority.HIGH)
    assert [queue.pop() for _ in range(4)] == ["h1", "n1", "n2", "l1"]


def test_a_full_queue_refuses_instead_of_growing() -> None:
    queue: RequestQueue[int] = RequestQueue(2)
    queue.put("a", 1)
    queue.put("b", 2)
    with pytest.raises(QueueFullError):
        queue.put("c", 3)
    assert len(queue) == 2


def test_a_cancelled_request_is_gone_at_once_and_never_taken() -> None:
    queue: RequestQueue[str] = RequestQueue(3)
    for key in "abc":
        queue.put(key, key)
    assert queue.cancel("b") == "b"
    assert "b" not in queue
    assert len(queue) == 2
    queue.put("d", "d")  # the slot was freed immediately
    assert [queue.pop(), queue.pop(), queue.pop(), queue.pop()] == ["a", "c", "d", None]
    assert queue.cancel("b") is None


def test_take_waits_for_work_and_times_out() -> None:
    queue: RequestQueue[str] = RequestQueue(3)
    assert queue.take(timeout=0.01) is None
    threading.Timer(0.05, queue.put, args=("x", "x")).start()
    assert queue.take(timeout=5) == "x"


def test_draining_hands_everything_back_and_closes() -> None:
    queue: RequestQueue[str] = RequestQueue(3)
    queue.put("a", "a", Priority.LOW)
    queue.put("b", "b", Priority.HIGH)
    assert queue.drain() == ["b", "a"]
    with pytest.raises(QueueFullError):
        queue.put("c", "c")


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 50)), max_size=30), st.integers(0, 200))
def test_selection_never_exceeds_its_byte_budget(items: list[tuple[int, int]], budget: int) -> None:
    queue: RequestQueue[int] = RequestQueue(100)
    for index, (priority, cost) in enumerate(items):
        queue.put(str(index), cost, Priority(priority))
    order = queue.items()
    chosen = queue.select(max_count=8, budget=budget, cost=lambda c: c)
    assert sum(chosen) <= budget
    assert len(chosen) <= 8
    assert chosen == order[: len(chosen)], "selection takes a prefix of the queue order"


def test_many_producers_one_consumer_lose_nothing() -> None:
    queue: RequestQueue[int] = RequestQueue(10_000)

    def produce(base: int) -> None:
        for i in range(500):
            queue.put(f"{base}-{i}", base * 1000 + i)

    producers = [threading.Thread(target=produce, args=(b,)) for b in range(8)]
    for thread in producers:
        thread.start()
    taken: list[int] = []
    while len(taken) < 4000:
        item = queue.take(timeout=5)
        assert item is not None
        taken.append(item)
    for thread in producers:
        thread.join()
    assert sorted(taken) == sorted(b * 1000 + i for b in range(8) for i in range(500))
