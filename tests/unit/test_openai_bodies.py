"""Several choices' streams merged as their items come: each stream's items in order, one
stream's error ends them all (and reaches the reader), a reader that stops ends the rest."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from semantic.adapters.http.openai_bodies import merged
from semantic.domain.errors import SemanticError


async def lines(name: str, n: int, fail: bool = False) -> AsyncIterator[str]:
    for i in range(n):
        await asyncio.sleep(0)
        yield f"{name}{i}"
    if fail:
        raise SemanticError(f"{name} failed")


async def test_each_streams_items_come_in_order_and_all_come() -> None:
    got = [line async for line in merged([lines("a", 3), lines("b", 2), lines("c", 0)])]
    assert sorted(got) == ["a0", "a1", "a2", "b0", "b1"]
    assert [g for g in got if g.startswith("a")] == ["a0", "a1", "a2"]


async def test_one_streams_error_reaches_the_reader() -> None:
    with pytest.raises(SemanticError, match="b failed"):
        async for _ in merged([lines("a", 50), lines("b", 1, fail=True)]):
            pass


async def test_a_reader_that_stops_cancels_the_other_streams() -> None:
    ended: list[str] = []

    async def endless() -> AsyncIterator[str]:
        try:
            while True:
                await asyncio.sleep(0)
                yield "x"
        finally:
            ended.append("endless")

    async with contextlib.aclosing(merged([endless(), lines("a", 1)])) as stream:
        async for _ in stream:
            break
    for _ in range(3):
        await asyncio.sleep(0)
    assert ended == ["endless"]
