"""A streamed response opens once its request is queued, as OpenAI's does: its first events
go out before the first token exists."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from semantic.adapters.http.responses_stream import ResponseEvents
from semantic.application.agents import TurnStarted
from semantic.application.generation import TextDelta
from semantic.application.responses import ResponseEvent


def kinds(lines: list[str]) -> list[str]:
    return [json.loads(line.split("data: ", 1)[1])["type"] for line in lines]


def test_created_and_in_progress_go_out_before_the_first_token_is_asked_for() -> None:
    first_token = asyncio.Event()
    asked = []

    async def rest() -> AsyncIterator[ResponseEvent]:
        asked.append("next")
        await first_token.wait()
        yield TextDelta("Hi")

    async def run() -> tuple[list[str], list[str]]:
        stream = ResponseEvents({"id": "resp_1", "status": "in_progress"}, "msg_1")
        lines = stream.stream(TurnStarted("req-1"), rest(), dict)
        before = [await anext(lines), await anext(lines)]
        assert not asked, "the first two events need nothing from the generation"
        first_token.set()
        return before, [line async for line in lines]

    before, after = asyncio.run(run())
    assert kinds(before) == ["response.created", "response.in_progress"]
    assert kinds(after) == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
