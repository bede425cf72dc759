"""A response's output items as the Responses API streams them: each added as it begins,
closed before the next is added, and closed as the stored response holds it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from semantic.adapters.http.responses_items import output_items
from semantic.adapters.http.responses_stream import ResponseEvents
from semantic.application.agents.responses import ResponseEvent
from semantic.application.agents.values import CommittedReply
from semantic.application.chat.generation import TextDelta, Usage
from semantic.application.chat.tool_replies import ArgumentsDelta, Call, CallOpened
from semantic.domain.generation import FinishReason, RequestStats

CALLS = (Call("call_a", "get_weather", '{"city": "Oslo"}'), Call("call_b", "get_time", "{}"))
REPLY = CommittedReply(
    "r1",
    "Let me look.",
    FinishReason.END_OF_TURN,
    Usage(10, 20, 0),
    RequestStats(0.0, 0.0, 0.0, 4, 8, 20),
    None,
    calls=CALLS,
)
EVENTS: list[ResponseEvent] = [
    TextDelta("Let me"),
    TextDelta(" look."),
    CallOpened(0, "call_a", "get_weather"),
    ArgumentsDelta(0, '{"city": '),
    ArgumentsDelta(0, '"Oslo"}'),
    CallOpened(1, "call_b", "get_time"),
    ArgumentsDelta(1, "{}"),
    REPLY,
]


async def rest() -> AsyncIterator[ResponseEvent]:
    for event in EVENTS[1:]:
        yield event


async def test_each_item_is_done_before_the_next_is_added_and_as_stored() -> None:
    body = {"id": "resp_1", "status": "completed", "output": output_items(REPLY, "msg_1")}
    stream = ResponseEvents({"id": "resp_1", "status": "in_progress", "output": []}, "msg_1")
    lines = [line async for line in stream.stream(EVENTS[0], rest(), lambda: body)]
    events: list[dict[str, Any]] = [
        json.loads(line.split("data: ", 1)[1]) for line in lines if "data: " in line
    ]
    lifecycle = [
        (e["type"].rsplit(".", 1)[-1], e["output_index"])
        for e in events
        if e["type"] in ("response.output_item.added", "response.output_item.done")
    ]
    assert lifecycle == [
        ("added", 0),
        ("done", 0),
        ("added", 1),
        ("done", 1),
        ("added", 2),
        ("done", 2),
    ]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == body["output"]
    arguments = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert "".join(e["delta"] for e in arguments if e["output_index"] == 1) == '{"city": "Oslo"}'
    assert events[-1]["type"] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
