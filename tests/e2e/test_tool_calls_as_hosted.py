"""Tool calls as OpenAI and Anthropic make them, through their official SDKs, on the
embedded 135M model: ``required``/``any`` always call, one tool several times in one
reply, and a call's arguments streamed as they are generated (issue 48)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import openai
import pytest
from openai.types.chat.chat_completion import Choice
from reliability.server import ServerProcess

pytestmark = pytest.mark.model

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {field: {"type": "string"}},
                "required": [field],
            },
        },
    }
    for name, description, field in (
        ("get_weather", "Current weather for one city", "city"),
        ("search_web", "Search the web", "query"),
        ("send_email", "Send an email", "to"),
    )
]
PROMPTS = [
    "Hello!",
    "What's 2+2?",
    "Tell me a joke",
    "Weather in Paris?",
    "Email bob@example.com that I'm late",
    "Who wrote Hamlet?",
    "Translate 'cat' to French",
    "Find the population of Japan",
    "Remind Alice about lunch",
    "Is it raining in Seattle?",
    "What is the tallest mountain?",
    "Write a haiku about the sea",
    "Send a thank-you note to carol@example.org",
    "Latest news about Mars rovers",
    "How do I bake bread?",
    "What's the temperature in Cairo right now?",
    "Tell Dave the meeting moved to 3pm",
    "Summarize the plot of Star Wars",
    "Book a table for two",
    "ok",
]
WEATHER_SHOT: list[Any] = [  # one example of three calls, as a client's history holds it
    {"role": "user", "content": "Weather in Berlin, Madrid and Vienna?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_shot{i}",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
            }
            for i, city in enumerate(("Berlin", "Madrid", "Vienna"))
        ],
    },
    *({"role": "tool", "tool_call_id": f"call_shot{i}", "content": "Sunny"} for i in range(3)),
    {"role": "assistant", "content": "All three are sunny."},
    {"role": "user", "content": "Weather in Paris, Tokyo and Cairo?"},
]


THREE_CITIES: dict[str, Any] = {
    "model": "default",
    "messages": WEATHER_SHOT,
    "tools": TOOLS[:1],
    "tool_choice": "required",
    "temperature": 0,
    "max_tokens": 120,
}


def oai(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_required_calls_a_tool_on_20_varied_prompts(server: ServerProcess) -> None:
    client = oai(server)
    names = {tool["function"]["name"] for tool in TOOLS}
    whole = 0

    def ask(prompt: str) -> Choice:
        return client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": prompt}],
            tools=TOOLS,
            tool_choice="required",
            temperature=0,
            max_tokens=160,
        ).choices[0]

    with ThreadPoolExecutor(10) as pool:  # batched: each gets what it gets alone (greedy)
        choices = list(pool.map(ask, PROMPTS))
    for prompt, choice in zip(PROMPTS, choices, strict=True):
        calls = choice.message.tool_calls or []
        assert calls, (prompt, choice)
        assert {c.function.name for c in calls} <= names  # type: ignore[union-attr]  # function calls
        assert not choice.message.content  # no text before the calls under "required"
        whole += choice.finish_reason == "tool_calls"
    assert whole >= 15  # the others ran a string to max_tokens: a call, cut ("length")


def test_anthropic_any_calls_a_tool(server: ServerProcess) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    tools: list[Any] = [
        {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS
    ]

    def ask(prompt: str) -> Any:
        return client.messages.create(
            model="default",
            max_tokens=160,
            messages=[{"role": "user", "content": prompt}],
            tools=tools,
            tool_choice={"type": "any"},
            extra_body={"temperature": 0},
        )

    with ThreadPoolExecutor(5) as pool:
        replies = list(pool.map(ask, PROMPTS[:5]))
    for prompt, reply in zip(PROMPTS[:5], replies, strict=True):
        assert reply.stop_reason == "tool_use", (prompt, reply)
        assert reply.content[0].type == "tool_use"


def test_one_tool_called_three_times_in_one_reply(server: ServerProcess) -> None:
    client = oai(server)
    body = THREE_CITIES
    choice = client.chat.completions.create(**body).choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    cities = [json.loads(c.function.arguments)["city"] for c in calls]
    assert cities == ["Paris", "Tokyo", "Cairo"]
    assert len({c.id for c in calls}) == 3
    serial = client.chat.completions.create(**body, parallel_tool_calls=False).choices[0]
    assert len(serial.message.tool_calls or []) == 1


def test_arguments_stream_as_generated_on_chat_completions(server: ServerProcess) -> None:
    client = oai(server)
    body = THREE_CITIES
    whole = client.chat.completions.create(**body).choices[0].message.tool_calls or []
    chunks = list(client.chat.completions.create(**body, stream=True))
    pieces = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    for index, call in enumerate(whole):
        mine = [p for p in pieces if p.index == index]
        assert mine[0].id
        assert mine[0].function
        assert mine[0].function.name == "get_weather"
        arguments = [p.function.arguments for p in mine[1:] if p.function]
        assert len(arguments) > 1  # token by token, not the call in one piece at the end
        assert "".join(a or "" for a in arguments) == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_arguments_stream_as_generated_on_responses(server: ServerProcess) -> None:
    client = oai(server)
    body: dict[str, Any] = {
        "model": "default",
        "input": "Weather in Paris?",
        "tools": [{"type": "function", **TOOLS[0]["function"]}],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "temperature": 0,
    }
    events = list(client.responses.create(**body, stream=True))
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    final = events[-1].response
    [call] = [item for item in final.output if item.type == "function_call"]
    assert len(deltas) > 1
    assert all(d.item_id == call.id for d in deltas)
    assert "".join(d.delta for d in deltas) == call.arguments
    added = [e for e in events if e.type == "response.output_item.added"]
    assert added[0].item.id == call.id
    assert events.index(added[0]) < events.index(deltas[0])
    assert client.responses.retrieve(final.id).output[-1] == call


def test_arguments_stream_as_generated_on_anthropic_messages(server: ServerProcess) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    body: dict[str, Any] = {
        "model": "default",
        "max_tokens": 120,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "extra_body": {"temperature": 0},
    }
    plain = client.messages.create(**body)
    with client.messages.stream(**body) as stream:
        events = list(stream)
        streamed = stream.get_final_message()
    partial = [e for e in events if e.type == "input_json" and e.partial_json]
    assert len(partial) > 1
    assert [b.model_dump(exclude={"id"}) for b in streamed.content] == [
        b.model_dump(exclude={"id"}) for b in plain.content
    ]
    assert streamed.stop_reason == plain.stop_reason == "tool_use"
