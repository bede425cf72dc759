"""OpenAI's ``n``: several replies to one prompt through the official SDK, whole and
streamed, on chat and completions, each choice under its own index, the prompt counted
once in the usage and the choices' tokens together."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from reliability.server import ServerProcess

from tests.e2e.sdk_types import openai_messages
from tests.e2e.test_openai_anthropic import oai

ASK = openai_messages([{"role": "user", "content": "Name a fruit."}])


def test_n_choices_each_with_its_index_and_the_prompt_counted_once(server: ServerProcess) -> None:
    client = oai(server)
    one = client.chat.completions.create(model="default", messages=ASK, max_tokens=6, seed=1)
    three = client.chat.completions.create(
        model="default", messages=ASK, max_tokens=6, temperature=1.0, seed=5, n=3, logprobs=True
    )
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert three.usage is not None
    assert one.usage is not None
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    tokens = [len(c.logprobs.content or []) if c.logprobs else 0 for c in three.choices]
    assert three.usage.completion_tokens >= sum(tokens) > 0  # an end of turn has no entry
    again = client.chat.completions.create(
        model="default", messages=ASK, max_tokens=6, temperature=1.0, seed=5, n=3
    )
    texts = [c.message.content for c in three.choices]
    assert [c.message.content for c in again.choices] == texts  # choice i: seed + i


def test_n_streamed_choices_rebuild_the_whole_ones(server: ServerProcess) -> None:
    client = oai(server)
    whole = client.chat.completions.create(
        model="default", messages=ASK, max_tokens=8, temperature=0, n=2
    )
    pieces: dict[int, str] = {}
    finished: dict[int, str | None] = {}
    for chunk in client.chat.completions.create(
        model="default", messages=ASK, max_tokens=8, temperature=0, n=2, stream=True
    ):
        for choice in chunk.choices:
            pieces[choice.index] = pieces.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason is not None:
                finished[choice.index] = choice.finish_reason
    assert pieces == {c.index: c.message.content for c in whole.choices}
    assert finished == {c.index: c.finish_reason for c in whole.choices}
    completions = client.completions.create(
        model="default", prompt="Apples are", max_tokens=4, n=2, temperature=0
    )
    assert [c.index for c in completions.choices] == [0, 1]
    assert completions.choices[0].text == completions.choices[1].text  # greedy: the same


@pytest.mark.parametrize("n", [0, 17])
def test_n_out_of_range_is_refused_naming_it(server: ServerProcess, n: int) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        oai(server).chat.completions.create(model="default", messages=ASK, max_tokens=2, n=n)
    body = refused.value.body
    assert isinstance(body, dict)
    assert body["param"] == "n"


def test_best_of_is_served_equal_to_n_and_refused_otherwise(server: ServerProcess) -> None:
    client = oai(server)
    done = client.completions.create(
        model="default", prompt="Apples are", max_tokens=2, n=2, best_of=2
    )
    assert len(done.choices) == 2
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="default", prompt="Apples are", max_tokens=2, best_of=3)
    body = refused.value.body
    assert isinstance(body, dict)
    assert body["param"] == "best_of"


def test_with_include_usage_every_chunk_says_usage_and_the_last_counts_all(
    server: ServerProcess,
) -> None:
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": "Name a fruit."}],
        "max_tokens": 4,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert all("usage" in event for event in events)
    assert all(event["usage"] is None for event in events[:-1])
    last = events[-1]
    assert last["choices"] == []
    assert last["usage"]["completion_tokens"] > 0
