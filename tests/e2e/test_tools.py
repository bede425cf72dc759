"""Tools and structured output on a real server, where the reply need not be constrained:
history with calls and results, the 400s of bad input (each naming its field, the server
alive after), ``count_tokens`` with tools, and tool results in the agents API. Replies
that must be calls are in ``test_tools_constrained.py``."""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

import anthropic
import httpx
import httpx2
import openai
import pytest
from reliability.server import ServerProcess

pytestmark = pytest.mark.model

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER},
}
ANTHROPIC_TOOL = {"name": "get_weather", "description": "Weather", "input_schema": WEATHER}
ASKED = {"role": "user", "content": "What is the weather in Paris?"}
CALLED = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ],
}
ANSWERED = {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}


def chat(server: ServerProcess, **body: Any) -> httpx.Response:
    body = {"model": "default", "max_tokens": 2, "temperature": 0, **body}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)


def messages(server: ServerProcess, **body: Any) -> httpx.Response:
    body = {"model": "default", "max_tokens": 2, "temperature": 0, **body}
    return httpx.post(f"{server.url}/v1/messages", json=body, timeout=60)


def test_openai_history_with_calls_and_results_is_read(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    reply = client.chat.completions.create(
        model="default",
        messages=[ASKED, CALLED, ANSWERED],  # type: ignore[list-item]  # dicts as clients send them
        tools=[TOOL],  # type: ignore[list-item]  # a dict as clients send it
        temperature=0,
        max_tokens=4,
    )
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    parts = {**ANSWERED, "content": [{"type": "text", "text": "Sunny"}]}
    assert chat(server, messages=[ASKED, CALLED, parts], tools=[TOOL]).status_code == 200
    for tool_choice in ("none", "auto", {"type": "function", "function": {"name": "get_weather"}}):
        assert (
            chat(server, messages=[ASKED], tools=[TOOL], tool_choice=tool_choice).status_code == 200
        )


def test_anthropic_history_with_tool_use_and_results_is_read(server: ServerProcess) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="unused")
    used = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
    for content in ("Sunny", [{"type": "text", "text": "Sunny"}]):
        for is_error in (False, True):
            result = {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": content,
                "is_error": is_error,
            }
            history: list[Any] = [  # dicts as clients send them
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Look."}, used]},
                {"role": "user", "content": [result, {"type": "text", "text": "Thanks"}]},
            ]
            tools: list[Any] = [ANTHROPIC_TOOL]
            reply = client.messages.create(
                model="default", max_tokens=3, messages=history, tools=tools
            )
            assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use")
    asked = [{"role": "user", "content": "Weather in Paris?"}]
    count = f"{server.url}/v1/messages/count_tokens"
    bare = httpx.post(count, json={"model": "default", "messages": asked}).json()
    listed = httpx.post(
        count, json={"model": "default", "messages": asked, "tools": [ANTHROPIC_TOOL]}
    ).json()
    assert listed["input_tokens"] > bare["input_tokens"] + 20  # the tools are in the prompt


def function(
    name: str = "get_weather", parameters: object = WEATHER, strict: bool = False
) -> dict[str, Any]:
    described = {"name": name, "parameters": parameters, "strict": strict}
    return {"type": "function", "function": described}


OPENAI_REFUSALS = [
    ({"tools": [function(parameters={"type": "string"})]}, "tools", "JSON Schema of an object"),
    ({"tools": [function(parameters=[1, 2])]}, "tools", "JSON Schema of an object"),
    (
        {"tools": [function(parameters={"type": "object", "if": {}}, strict=True)]},
        "tools",
        "keyword 'if'",
    ),
    (
        {"tools": [function(parameters={"$ref": "https://example.com/s.json"}, strict=True)]},
        "tools",
        "keyword '$ref'",
    ),
    ({"tools": [function(name="get weather")]}, "tools", "must match"),
    ({"tools": [function(name="x" * 65)]}, "tools", "must match"),
    ({"tools": [function(), function()]}, "tools", "used twice"),
    ({"tools": [{"type": "retrieval"}]}, "tools", "only tools of type 'function'"),
    (
        {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
        "tool_choice",
        "not one of the tools",
    ),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice", "tool_choice must be"),
    ({"response_format": {"type": "yaml"}}, "response_format", "type must be"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema must be"),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "a", "strict": True, "schema": {"not": {}}},
            }
        },
        "response_format",
        "keyword 'not'",
    ),
    (
        {"messages": [ASKED, {**ANSWERED, "tool_call_id": "call_9"}]},
        "messages",
        "answers no call",
    ),
    (
        {"messages": [ASKED, CALLED, {**ANSWERED, "tool_call_id": "call_9"}]},
        "messages",
        "answers no call",
    ),
    ({"messages": [ASKED, {"role": "tool", "content": "x"}]}, "messages", "tool_call_id"),
    (
        {"tools": [{**TOOL, "function": {**TOOL["function"], "description": "weather " * 9000}}]},
        "tools",
        "leave no room",
    ),
]


@pytest.mark.parametrize(("body", "param", "says"), OPENAI_REFUSALS)
def test_bad_tool_input_is_a_400_naming_the_field(
    server: ServerProcess, body: dict[str, Any], param: str, says: str
) -> None:
    refused = chat(server, **{"messages": [ASKED], **body})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == param
    assert says in error["message"]
    assert chat(server, messages=[ASKED]).status_code == 200  # and the server serves on


ANTHROPIC_REFUSALS = [
    (
        {"tools": [{**ANTHROPIC_TOOL, "input_schema": {"type": "array"}}]},
        "JSON Schema of an object",
    ),
    ({"tools": [{**ANTHROPIC_TOOL, "name": "get.weather"}]}, "must match"),
    ({"tools": [ANTHROPIC_TOOL, ANTHROPIC_TOOL]}, "used twice"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tools"),
    ({"tools": [{"name": "get_weather"}]}, "needs its input_schema"),
    ({"tools": [{**ANTHROPIC_TOOL, "defer_loading": True}]}, "tool search"),
    ({"tools": [{**ANTHROPIC_TOOL, "allowed_callers": ["code_execution_20250825"]}]}, "'direct'"),
    ({"tools": [{**ANTHROPIC_TOOL, "input_examples": ["Lima"]}]}, "list of objects"),
    ({"tools": [{**ANTHROPIC_TOOL, "strict": "yes"}]}, "strict must be true or false"),
    (
        {"tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "tool", "name": "x"}},
        "not one of the tools",
    ),
    ({"tool_choice": {"type": "any"}}, "needs tools"),
    ({"tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "maybe"}}, "tool_choice type"),
    (
        {
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"}],
                },
            ]
        },
        "answers no call",
    ),
    (
        {"tools": [{**ANTHROPIC_TOOL, "description": "weather " * 9000}]},
        "leave no room",
    ),
]


@pytest.mark.parametrize(("body", "says"), ANTHROPIC_REFUSALS)
def test_bad_anthropic_tool_input_is_a_400(
    server: ServerProcess, body: dict[str, Any], says: str
) -> None:
    refused = messages(server, **{"messages": [{"role": "user", "content": "Hi"}], **body})
    assert refused.status_code == 400, refused.text
    assert refused.json()["type"] == "error"
    assert says in refused.json()["error"]["message"]
    assert messages(server, messages=[{"role": "user", "content": "Hi"}]).status_code == 200


def test_an_agents_tool_result_must_answer_one_of_its_calls(server: ServerProcess) -> None:
    agent = f"tools-{uuid.uuid4().hex[:8]}"
    api = f"{server.url}/v1/agents"
    assert httpx.post(api, json={"id": agent}).status_code == 201
    sent = httpx.post(
        f"{api}/{agent}/messages",
        json={"content": "Weather in Paris?", "max_tokens": 3, "tools": [TOOL]},
        timeout=60,
    )
    assert sent.status_code == 200, sent.text
    stray = {"role": "tool", "tool_call_id": "call_x", "content": "Sunny", "max_tokens": 2}
    refused = httpx.post(f"{api}/{agent}/messages", json=stray, timeout=60)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "tool_call_id"
    assert "answers no call" in refused.json()["error"]["message"]
    unnamed = httpx.post(f"{api}/{agent}/messages", json={**stray, "tool_call_id": None})
    assert unnamed.status_code == 400
    bad_tool = {"content": "Hi", "tools": [function(name="no spaces")]}
    assert httpx.post(f"{api}/{agent}/messages", json=bad_tool).json()["error"]["param"] == "tools"
    listed = httpx.get(f"{api}/{agent}/messages").json()["data"]
    assert [m["role"] for m in listed] == ["user", "assistant"]  # the refused turns kept nothing


def test_the_anthropic_tool_runner_runs_its_tools_in_a_thread(server: ServerProcess) -> None:
    """The SDK's tool runner holds its conversation in a message thread (a beta): each
    turn after the first sends only its tool results, and the server continues the
    conversation it holds under the last reply's id."""
    sent: list[Any] = []

    def record(request: httpx2.Request) -> None:
        sent.append(json.loads(request.content).get("thread"))

    watched = httpx2.Client(event_hooks={"request": [record]})  # the SDK's own HTTP client
    client = anthropic.Anthropic(
        base_url=server.url, api_key="unused", max_retries=0, http_client=watched
    )
    asked: list[str] = []

    @anthropic.beta_tool
    def get_weather(city: Literal["Paris", "Oslo"]) -> str:  # short calls, however sampled
        """The weather in a city.

        Args:
            city: The city's name.
        """
        asked.append(city)
        return "Sunny"

    runner = client.beta.messages.tool_runner(
        model="default",
        max_tokens=60,
        max_iterations=3,
        tools=[get_weather],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    )
    replies = list(runner)
    assert [r.stop_reason for r in replies] == ["tool_use"] * 3, replies
    assert len(asked) == 3  # its tool ran after each reply
    assert [thread["type"] for thread in sent] == ["create", "continue", "continue"]
    assert sent[1]["previous_message_id"] == replies[0].id


def test_a_thread_continues_as_the_whole_conversation_would(server: ServerProcess) -> None:
    """A continuation sends only the new messages; its reply is the one the whole
    conversation, sent unthreaded, gets, and the thread moves on to it. What it cannot
    continue is refused with the codes Anthropic's SDK recovers by."""
    url = f"{server.url}/v1/messages"
    first_turn = [{"role": "user", "content": "Name a colour."}]
    body = {"model": "default", "max_tokens": 8, "temperature": 0, "system": "Be brief."}
    created = httpx.post(url, json={**body, "messages": first_turn, "thread": {"type": "create"}})
    assert created.status_code == 200
    reply = created.json()
    more = [{"role": "user", "content": "And another?"}]
    thread = {"type": "continue", "previous_message_id": reply["id"]}
    plain = {k: v for k, v in body.items() if k != "system"}
    continued = httpx.post(url, json={**plain, "messages": more, "thread": thread})
    assert continued.status_code == 200, continued.text
    whole = [*first_turn, {"role": "assistant", "content": reply["content"]}, *more]
    unthreaded = httpx.post(url, json={**body, "messages": whole})
    assert continued.json()["content"] == unthreaded.json()["content"]
    assert continued.json()["usage"]["cache_read_input_tokens"] > 0
    moved = {"type": "continue", "previous_message_id": continued.json()["id"]}
    streamed = httpx.post(url, json={**plain, "messages": more, "thread": moved, "stream": True})
    lines = streamed.text.splitlines()
    started = next(ln for ln in lines if ln.startswith("data:") and "message_start" in ln)
    streamed_id = json.loads(started.removeprefix("data: "))["message"]["id"]
    onwards = {"type": "continue", "previous_message_id": streamed_id}  # held as it ended
    assert httpx.post(url, json={**plain, "messages": more, "thread": onwards}).status_code == 200
    again = httpx.post(url, json={**body, "messages": more, "thread": thread})
    assert again.status_code == 400  # its system prompt comes from the thread
    assert again.json()["error"]["message"].startswith("system comes from the thread")
    for lost in (thread, {"type": "continue", "previous_message_id": "msg_unknown"}):
        missing = httpx.post(url, json={**plain, "messages": more, "thread": lost})
        assert missing.status_code == 404  # moved on from (the SDK replays it whole), or never
        assert missing.json()["error"]["details"] == {"error_code": "thread_not_found"}
    added = {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "get_weather"}}
    changing = [{"role": "system", "content": [added]}, *more]  # the SDK's add_tools()
    refused = httpx.post(url, json={**plain, "messages": changing})
    assert refused.status_code == 400
    assert "'tool_addition' is not supported" in refused.json()["error"]["message"]
    counted = httpx.post(
        f"{url}/count_tokens", json={"model": "default", "messages": more, "thread": thread}
    )
    assert counted.status_code == 400
    assert counted.json()["error"]["details"]["error_code"] == "thread_unsupported_request"
