"""A reply's calls as each protocol streams them, from a canned reply: the official SDKs'
own stream accumulators must rebuild exactly the reply sent without streaming."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk
from pydantic import TypeAdapter

from semantic.adapters.http import anthropic_routes, openai_bodies
from semantic.adapters.http.anthropic_tools import new_tool_use_id
from semantic.adapters.tool_formats import DefaultFormat
from semantic.application.chat.chat_reply import ChatOutcome, ChatReply
from semantic.application.chat.generation import GenerationResult, TextDelta, Usage
from semantic.application.chat.tool_replies import Reply, ReplyReader
from semantic.application.chat.transcript import new_call_id
from semantic.domain.generation import FinishReason, RequestStats

PIECES = [
    "I will look",
    " it up.\n<tool",
    '_call>{"name": "get_weather", "arguments": {"city": ',
    '"Paris", "days": [1, ',
    '2]}}</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
]


class CannedHandle:
    """What the routes read of a ``GenerationHandle``: its events, and its prompt counts."""

    prompt_tokens = 12
    cached_tokens = 4

    def __init__(self, pieces: list[str], finish: FinishReason) -> None:
        self._pieces = pieces
        self._finish = finish

    async def events(self) -> AsyncGenerator[TextDelta | GenerationResult, None]:
        for piece in self._pieces:
            yield TextDelta(piece)
        yield result(self._pieces, self._finish)

    def close(self) -> None:
        pass


def result(pieces: list[str], finish: FinishReason) -> GenerationResult:
    stats = RequestStats(0.0, 0.0, 0.0, 4, 8, len(pieces))
    return GenerationResult("r1", "".join(pieces), finish, Usage(12, len(pieces), 4), stats, None)


async def nothing_kept(reply: Reply) -> None:
    pass


def canned_reply(
    pieces: list[str], finish: FinishReason, new_id: Any, *, must_call: bool = False
) -> ChatReply:
    """The chat turn's reply over a canned generation, its calls read in the default format."""
    reader = ReplyReader(DefaultFormat(), new_id)
    handle = CannedHandle(pieces, finish)
    return ChatReply(handle, reader, nothing_kept, None, must_call=must_call)  # type: ignore[arg-type]  # a canned handle


def whole(pieces: list[str], new_id: Any) -> Reply:
    reader = ReplyReader(DefaultFormat(), new_id)
    for piece in pieces:
        reader.feed(piece)
    return reader.finish()[1]


def data_lines(lines: list[str]) -> list[dict[str, Any]]:
    return [
        json.loads(line.split("data: ", 1)[1])
        for chunk in lines
        for line in chunk.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


def fixed_ids(prefix: str) -> Any:
    count = iter(range(100))
    return lambda: f"{prefix}{next(count)}"


@pytest.mark.parametrize(
    ("pieces", "finish"),
    [(PIECES, FinishReason.END_OF_TURN), (PIECES[:3], FinishReason.MAX_TOKENS)],
)
async def test_openai_stream_rebuilds_the_reply_without_streaming(
    pieces: list[str], finish: FinishReason
) -> None:
    bodies = openai_bodies.ReplyBodies("chatcmpl", "chat.completion", "m")
    plain = bodies.chat([ChatOutcome(result(pieces, finish), whole(pieces, fixed_ids("call_")))])
    reply = canned_reply(pieces, finish, fixed_ids("call_"))
    lines = [line async for line in bodies.chat_chunks([reply], False)]
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    for body in data_lines(lines):
        state.handle_chunk(ChatCompletionChunk.model_validate(body))
    streamed = state.current_completion_snapshot.choices[0]
    message = plain["choices"][0]["message"]
    assert streamed.finish_reason == plain["choices"][0]["finish_reason"]
    assert (streamed.message.content or None) == (message["content"] or None)
    calls = [c.model_dump(exclude={"index"}) for c in streamed.message.tool_calls or []]
    for call in calls:
        call["function"].pop("parsed_arguments", None)
    assert calls == message.get("tool_calls", [])
    if finish is FinishReason.MAX_TOKENS:  # cut inside a call: the call as far as it came
        assert streamed.finish_reason == "length"
        assert message["content"] == "I will look it up."
        assert [c["function"]["arguments"] for c in calls] == ['{"city": ']
    else:
        assert streamed.finish_reason == "tool_calls"
        assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
        assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "days": [1, 2]}
        assert all(c["id"].startswith("call_") for c in calls)
        first = next(
            b
            for b in data_lines(lines)
            if b["choices"] and "tool_calls" in b["choices"][0]["delta"]
        )
        opening = first["choices"][0]["delta"]["tool_calls"][0]
        assert opening["function"] == {"name": "get_weather", "arguments": ""}
        assert {"index", "id", "type"} <= opening.keys()


async def test_a_stream_that_must_call_opens_with_no_text() -> None:
    """``tool_choice`` required or named: the reply is calls alone, so the stream opens
    with ``content: null`` (OpenAI's), and a client's snapshot has no empty text."""
    calls = ["<tool" + PIECES[2], *PIECES[3:]]  # the calls, no text before them
    bodies = openai_bodies.ReplyBodies("chatcmpl", "chat.completion", "m")
    reply = canned_reply(calls, FinishReason.END_OF_TURN, fixed_ids("call_"), must_call=True)
    lines = [line async for line in bodies.chat_chunks([reply], False)]
    assert data_lines(lines)[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    for body in data_lines(lines):
        state.handle_chunk(ChatCompletionChunk.model_validate(body))
    assert state.current_completion_snapshot.choices[0].message.content is None


@pytest.mark.parametrize(
    ("pieces", "finish", "window", "expected"),
    [
        (PIECES, FinishReason.END_OF_TURN, 8192, "tool_use"),
        (PIECES[:3], FinishReason.MAX_TOKENS, 8192, "max_tokens"),
        (PIECES[:4], FinishReason.MAX_TOKENS, 8192, "max_tokens"),  # a partial input
        (PIECES[:3], FinishReason.MAX_TOKENS, 12 + 3, "model_context_window_exceeded"),
    ],
)
async def test_anthropic_stream_rebuilds_the_reply_without_streaming(
    pieces: list[str], finish: FinishReason, window: int, expected: str
) -> None:
    """``window``: the model's context; the 12-token prompt and the reply filling it, the
    reply was cut by the window, not by a ``max_tokens`` the client chose."""
    outcome = ChatOutcome(result(pieces, finish), whole(pieces, fixed_ids("toolu_")))
    plain = anthropic_routes.message_body("msg_1", "m", outcome, window)
    reply = canned_reply(pieces, finish, fixed_ids("toolu_"))
    events = anthropic_routes.message_events(reply, "msg_1", "m", window)
    lines = [line async for line in events]
    adapter: TypeAdapter[RawMessageStreamEvent] = TypeAdapter(RawMessageStreamEvent)
    snapshot = None
    buffers: dict[int, bytes] = {}
    for body in data_lines(lines):
        if body["type"] == "ping":
            continue
        event = adapter.validate_python(body)
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=buffers)
    assert snapshot is not None
    content = [block.model_dump(exclude_none=True) for block in snapshot.content]
    for block in content:
        block.pop("parsed_output", None)
    assert content == plain["content"]  # a cut call's input: as far as it came, both ways
    assert snapshot.stop_reason == plain["stop_reason"]
    assert plain["stop_reason"] == expected
    assert [b["type"] for b in content][:2] == ["text", "tool_use"]
    if finish is FinishReason.END_OF_TURN:
        assert [b["type"] for b in content] == ["text", "tool_use", "tool_use"]
        assert content[1]["input"] == {"city": "Paris", "days": [1, 2]}
        assert content[1]["id"].startswith("toolu_")
    elif len(pieces) == 4:
        assert content[1]["input"] == {"city": "Paris", "days": [1]}


def test_ids_have_each_protocols_prefix() -> None:
    assert new_call_id().startswith("call_")
    assert new_tool_use_id().startswith("toolu_")
