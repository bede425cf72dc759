from __future__ import annotations

import asyncio

from semantic.application.agents.keyed_locks import KeyedLocks


async def test_a_key_is_held_by_one_at_a_time_and_forgotten_once_free() -> None:
    locks = KeyedLocks()
    order: list[str] = []

    async def hold(name: str, entered: asyncio.Event, go: asyncio.Event) -> None:
        async with locks.hold("agent"):
            entered.set()
            order.append(f"{name} in")
            await go.wait()
            order.append(f"{name} out")

    first_in, second_in, go = asyncio.Event(), asyncio.Event(), asyncio.Event()
    first = asyncio.create_task(hold("first", first_in, go))
    await first_in.wait()
    second = asyncio.create_task(hold("second", second_in, go))
    await asyncio.sleep(0)  # the second is waiting now
    assert len(locks) == 1
    assert not second_in.is_set()
    go.set()
    await asyncio.gather(first, second)
    assert order == ["first in", "first out", "second in", "second out"]
    assert len(locks) == 0, "no lock kept for a key nobody holds"


async def test_a_holder_that_raises_lets_the_key_go() -> None:
    locks = KeyedLocks()
    try:
        async with locks.hold("agent"):
            raise ValueError("boom")
    except ValueError:
        pass
    assert len(locks) == 0
    async with locks.hold("agent"):
        assert len(locks) == 1
