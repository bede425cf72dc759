"""Log-probabilities through OpenAI's SDK: chat's ``logprobs.content`` (whole and streamed),
the legacy completions' lists and the Responses API's ``output_text.logprobs``, each token's
text adding up to the reply's."""

from __future__ import annotations

import functools
import math
from typing import cast

import openai
import pytest
from openai.types.chat import ChatCompletionChunk, ChatCompletionFunctionToolParam
from openai.types.responses import (
    Response,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
)
from reliability.server import ServerProcess

from tests.e2e.sdk_types import openai_messages
from tests.e2e.test_openai_anthropic import oai

ASK = openai_messages([{"role": "user", "content": "What is the capital of France?"}])


def test_a_chat_reply_carries_each_tokens_logprob_whole_and_streamed(
    server: ServerProcess,
) -> None:
    create = functools.partial(
        oai(server).chat.completions.create,
        model="default",
        messages=ASK,
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    whole = create()
    choice = whole.choices[0]
    assert choice.logprobs is not None
    assert choice.logprobs.content is not None
    content = choice.logprobs.content
    assert "".join(entry.token for entry in content) == choice.message.content
    assert whole.usage is not None
    assert len(content) <= whole.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0.0
        assert entry.bytes == list(entry.token.encode())
        assert [alt.token for alt in entry.top_logprobs][:1] == [entry.token]  # greedy
        values = [alt.logprob for alt in entry.top_logprobs]
        assert len(values) == 2
        assert values == sorted(values, reverse=True)
    chunks = cast("openai.Stream[ChatCompletionChunk]", create(stream=True))  # partial's type
    pieces = [
        chunk.choices[0].logprobs.content
        for chunk in chunks
        if chunk.choices and chunk.choices[0].logprobs
    ]
    entries = [e for piece in pieces if piece for e in piece]
    assert [e.token for e in entries] == [e.token for e in content]
    # the prompt is cached now: its uncached tail is computed in other chunks, which moves
    # the last bits of the first token's scores
    for ours, theirs in zip(entries, content, strict=True):
        assert math.isclose(ours.logprob, theirs.logprob, abs_tol=1e-4)


def test_a_limit_inside_a_character_keeps_each_tokens_logprob_whole_and_streamed(
    server: ServerProcess,
) -> None:
    """Tokens whose bytes the limit left short of a character show no text, and still
    have their entries (their bytes, as every token's), as many as the tokens counted."""
    create = functools.partial(
        oai(server).chat.completions.create,
        model="default",
        messages=openai_messages([{"role": "user", "content": "Write three emojis about joy: 😀"}]),
        temperature=0,
        logprobs=True,
    )
    uncut = create(max_tokens=8).choices[0].message.content or ""
    whole = create(max_tokens=2)
    assert whole.usage is not None
    logprobs = whole.choices[0].logprobs
    assert logprobs is not None
    content = logprobs.content or []
    assert len(content) == whole.usage.completion_tokens == 2
    said = bytes(b for entry in content for b in entry.bytes or [])
    assert uncut.encode().startswith(said)
    assert whole.choices[0].message.content == said.decode(errors="ignore")
    chunks = cast("openai.Stream[ChatCompletionChunk]", create(max_tokens=2, stream=True))
    streamed = [
        entry
        for chunk in chunks
        if chunk.choices and chunk.choices[0].logprobs
        for entry in chunk.choices[0].logprobs.content or []
    ]
    assert [e.bytes for e in streamed] == [e.bytes for e in content]
    events = oai(server).responses.create(
        model="default",
        input="Write three emojis about joy: 😀",
        max_output_tokens=2,
        temperature=0,
        include=["message.output_text.logprobs"],
        stream=True,
    )
    deltas = [e for e in events if isinstance(e, ResponseTextDeltaEvent)]
    assert [len(e.logprobs) for e in deltas] == [2]  # one delta, no text: the cut's tokens


def test_a_completion_carries_its_tokens_offsets_and_alternatives(server: ServerProcess) -> None:
    done = oai(server).completions.create(
        model="default", prompt="The capital of France is", max_tokens=6, logprobs=3
    )
    lists = done.choices[0].logprobs
    assert lists is not None
    assert lists.tokens is not None
    assert lists.text_offset is not None
    assert lists.top_logprobs is not None
    assert "".join(lists.tokens) == done.choices[0].text
    assert lists.text_offset == [sum(map(len, lists.tokens[:i])) for i in range(len(lists.tokens))]
    assert all(len(alternatives) <= 3 for alternatives in lists.top_logprobs)


@pytest.mark.parametrize(
    ("asked", "words"),
    [({"top_logprobs": 2}, "needs logprobs=true"), ({"logprobs": True, "top_logprobs": 21}, "20")],
)
def test_top_logprobs_out_of_place_is_refused_naming_it(
    server: ServerProcess, asked: dict[str, object], words: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        oai(server).chat.completions.create(model="default", messages=ASK, max_tokens=2, **asked)  # type: ignore[call-overload]  # test passthrough
    body = refused.value.body
    assert isinstance(body, dict)
    assert body["param"] == "top_logprobs"
    assert words in body["message"]


def test_a_reply_that_calls_a_tool_has_no_logprobs(server: ServerProcess) -> None:
    """OpenAI's figures are the content's; a reply of calls has none to show."""
    weather: ChatCompletionFunctionToolParam = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    called = oai(server).chat.completions.create(
        model="default",
        messages=openai_messages([{"role": "user", "content": "Weather in Paris?"}]),
        tools=[weather],
        tool_choice="required",
        max_tokens=48,
        logprobs=True,
    )
    choice = called.choices[0]
    assert choice.message.tool_calls
    assert choice.logprobs is None


def _text_part(response: Response) -> ResponseOutputText:
    message = response.output[0]
    assert isinstance(message, ResponseOutputMessage)
    part = message.content[0]
    assert isinstance(part, ResponseOutputText)
    return part


def test_a_response_carries_its_texts_logprobs_when_included_whole_and_streamed(
    server: ServerProcess,
) -> None:
    create = functools.partial(
        oai(server).responses.create,
        model="default",
        input="What is the capital of France?",
        max_output_tokens=8,
        temperature=0,
        include=["message.output_text.logprobs"],
        top_logprobs=2,
    )
    whole = create()
    entries = _text_part(whole).logprobs or []
    assert entries
    assert "".join(entry.token for entry in entries) == whole.output_text
    for entry in entries:
        assert entry.logprob <= 0.0
        assert entry.bytes == list(entry.token.encode())
        values = [alt.logprob for alt in entry.top_logprobs]
        assert len(values) == 2
        assert values == sorted(values, reverse=True)
    events = cast("openai.Stream[ResponseStreamEvent]", create(stream=True))  # partial's type
    streamed = [
        e for event in events if isinstance(event, ResponseTextDeltaEvent) for e in event.logprobs
    ]
    assert [e.token for e in streamed] == [e.token for e in entries]
    for ours, theirs in zip(streamed, entries, strict=True):
        assert math.isclose(ours.logprob, theirs.logprob, abs_tol=1e-4)
    plain = oai(server).responses.create(
        model="default", input="What is the capital of France?", max_output_tokens=4
    )
    assert _text_part(plain).logprobs == []


def test_a_responses_top_logprobs_out_of_range_is_refused_naming_it(server: ServerProcess) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        oai(server).responses.create(
            model="default", input="Hi", max_output_tokens=2, top_logprobs=21
        )
    body = refused.value.body
    assert isinstance(body, dict)
    assert body["param"] == "top_logprobs"
