"""Replies that must be tool calls or JSON of a schema, on the embedded 135M model.

Every test here needs the engine to generate under the request's ``OutputConstraint``
(issue 34 item 4): without it, a model this small rarely writes a call at all. The edge
builds the constraint (``GenerationInput.constraint``); these tests show the whole path.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import anthropic
import httpx
import jsonschema
import openai
import pytest
from reliability.server import ServerProcess

pytestmark = pytest.mark.model

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "maxLength": 40}},
    "required": ["timezone"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather forecast for a city",
            "parameters": WEATHER,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The time in a timezone",
            "parameters": TIME,
        },
    },
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
PROMPTS = [
    f"{ask} {place}?"
    for ask in (
        "What is the weather in",
        "Will it rain in",
        "How warm is it in",
        "Forecast for",
        "What time is it in",
    )
    for place in ("Paris", "Tokyo", "Lima", "Oslo")
]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
    },
    "required": ["name", "age", "hobbies"],
    "additionalProperties": False,
}


def oai(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def each(prompts: list[str], ask: Callable[[str], Any]) -> list[Any]:
    """Asked at once (batched, each gets what it gets alone under greedy decoding)."""
    with ThreadPoolExecutor(10) as pool:
        return list(pool.map(ask, prompts))


def test_forced_tool_choice_gives_valid_calls_20_of_20(server: ServerProcess) -> None:
    client = oai(server)

    def ask(prompt: str) -> Any:
        named = "get_time" if "time" in prompt else "get_weather"
        choice: Any = (
            "required"
            if prompt.endswith(("Paris?", "Lima?"))
            else {"type": "function", "function": {"name": named}}
        )
        return client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": prompt}],
            tools=TOOLS,
            tool_choice=choice,
            temperature=0,
            max_tokens=256,  # room for the several calls parallel calls allow
        )

    replies = each(PROMPTS, ask)
    assert len(replies) == 20
    for prompt, reply in zip(PROMPTS, replies, strict=True):
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", (prompt, choice)
        for call in choice.message.tool_calls:
            assert call.id.startswith("call_")
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_openai_tool_round_trip_streams_alike_and_keeps_the_cache(
    new_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Call, result, final answer; the streamed call is the unstreamed one; the next
    request reuses the prompt and the generated call, also after a restart."""
    data = tmp_path / "data"
    first = new_server(data_dir=data)
    asked = [
        {"role": "system", "content": "You help with weather."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    body: dict[str, Any] = {
        "model": "default",
        "messages": asked,
        "tools": TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "temperature": 0,
        "max_tokens": 120,
    }
    reply = oai(first).chat.completions.create(**body)
    [call] = reply.choices[0].message.tool_calls or []
    streamed = oai(first).chat.completions.create(**body, stream=True)
    pieces: dict[int, dict[str, str]] = {}
    for chunk in streamed:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = pieces.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += delta.id or ""
            entry["name"] += (delta.function.name or "") if delta.function else ""
            entry["arguments"] += (delta.function.arguments or "") if delta.function else ""
    assert [(p["name"], p["arguments"]) for p in pieces.values()] == [
        (call.function.name, call.function.arguments)
    ]
    assert first.stop() == 0

    second = new_server(data_dir=data)  # the cache and the call's memory are on disk
    resent = json.dumps(json.loads(call.function.arguments), indent=2, sort_keys=True)
    sent_back = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": resent},
            }
        ],
    }
    result = {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"}
    final = oai(second).chat.completions.create(
        **{**body, "messages": [*asked, sent_back, result], "tool_choice": "none", "max_tokens": 30}
    )
    assert final.choices[0].finish_reason in ("stop", "length")
    assert final.choices[0].message.content
    assert reply.usage is not None
    assert final.usage is not None
    before = reply.usage.prompt_tokens + reply.usage.completion_tokens
    details = final.usage.prompt_tokens_details
    assert details is not None
    cached = details.cached_tokens or 0
    assert cached >= 0.95 * before, (cached, before)


def test_the_older_function_calling_round_trips_as_clients_written_for_it_send_it(
    server: ServerProcess,
) -> None:
    """``functions`` and ``function_call`` (before ``tools``): the reply's one call comes as
    ``message.function_call`` (finish ``function_call``), streamed alike, and sent back
    with a ``function`` message's result it continues the cached conversation."""
    asked: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    ask: dict[str, Any] = {"model": "default", "messages": asked, "temperature": 0}
    functions: Any = [{"name": "get_weather", "description": "Weather", "parameters": WEATHER}]
    named: Any = {"name": "get_weather"}
    client = oai(server)
    reply = client.chat.completions.create(
        **ask, max_tokens=120, functions=functions, function_call=named
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "function_call"
    assert choice.message.tool_calls is None
    called = choice.message.function_call
    assert called is not None
    assert called.name == "get_weather"
    jsonschema.validate(json.loads(called.arguments), WEATHER)
    name, arguments = "", ""
    for chunk in client.chat.completions.create(
        **ask, max_tokens=120, functions=functions, function_call=named, stream=True
    ):
        piece = chunk.choices[0].delta.function_call if chunk.choices else None
        name += (piece.name or "") if piece else ""
        arguments += (piece.arguments or "") if piece else ""
    assert (name, arguments) == (called.name, called.arguments)
    history = [
        *asked,
        choice.message.model_dump(),  # as the SDK dumps it: null tool_calls beside the call
        {"role": "function", "name": "get_weather", "content": "Sunny, 21 C"},
    ]
    final = client.chat.completions.create(
        **{**ask, "messages": history}, max_tokens=20, functions=functions, function_call="none"
    )
    assert final.choices[0].message.content
    assert reply.usage is not None
    assert final.usage is not None
    details = final.usage.prompt_tokens_details
    cached = details.cached_tokens if details else 0
    assert (cached or 0) >= 0.9 * (reply.usage.prompt_tokens + reply.usage.completion_tokens)
    orphan = [*asked, {"role": "function", "name": "get_time", "content": "noon"}]
    with pytest.raises(openai.BadRequestError, match="none was made of 'get_time'"):
        client.chat.completions.create(**{**ask, "messages": orphan}, max_tokens=5)


def is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def test_a_constrained_call_cut_by_max_tokens_ends_as_length(server: ServerProcess) -> None:
    """Cut before the tool's name: no call, and none of its markup as text, streamed or
    not. Cut inside the arguments: the call as far as it came, streamed and not streamed
    alike (as OpenAI's is)."""
    client = oai(server)
    body: dict[str, Any] = {
        "model": "default",
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": TOOLS,
        "tool_choice": "required",
        "temperature": 0,
    }
    early = client.chat.completions.create(**body, max_tokens=6).choices[0]
    assert early.finish_reason == "length"
    assert not early.message.tool_calls
    assert not early.message.content
    early_chunks = list(client.chat.completions.create(**body, max_tokens=6, stream=True))
    assert not "".join(c.choices[0].delta.content or "" for c in early_chunks if c.choices)
    late = client.chat.completions.create(**body, max_tokens=24).choices[0]
    assert late.finish_reason == "length"
    [call] = late.message.tool_calls or []
    assert call.function.arguments.startswith("{")
    chunks = list(client.chat.completions.create(**body, max_tokens=24, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    pieces = [t for d in deltas for t in d.tool_calls or []]
    assert [p.function.name for p in pieces if p.id] == ["get_weather"]
    assert "".join(p.function.arguments or "" for p in pieces) == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "length"
    assert not is_json(call.function.arguments)  # cut, as it is sent back: an opaque string
    result = {"role": "tool", "tool_call_id": call.id, "content": "error: the call was cut"}
    history = [*body["messages"], late.message.model_dump(exclude_none=True), result]
    resent = client.chat.completions.create(**{**body, "messages": history}, max_tokens=5)
    assert resent.choices[0].finish_reason in ("length", "tool_calls", "stop")
    flat: Any = [{"type": "function", **t["function"]} for t in TOOLS]
    asked: Any = [{"role": "user", "content": "Weather in Oslo?"}]
    ask: dict[str, Any] = {"model": "default", "tools": flat, "tool_choice": "required"}
    first = client.responses.create(**ask, input=asked, max_output_tokens=24, store=False)
    assert first.status == "incomplete"
    [item] = [i for i in first.output if i.type == "function_call"]
    answered: Any = {"type": "function_call_output", "call_id": item.call_id, "output": "cut"}
    stateless: Any = [*asked, item.model_dump(exclude_none=True), answered]
    again = client.responses.create(**ask, input=stateless, max_output_tokens=16, store=False)
    assert again.status in ("completed", "incomplete")
    cut = anthropic.Anthropic(base_url=server.url, api_key="unused").messages.create(
        model="default",
        max_tokens=6,
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[{"name": "get_weather", "input_schema": WEATHER}],
        tool_choice={"type": "any"},
    )
    assert cut.stop_reason == "max_tokens"
    assert [(block.type, getattr(block, "text", "")) for block in cut.content] == [("text", "")]


def test_stop_strings_end_a_replys_text_and_never_cut_its_calls(server: ServerProcess) -> None:
    """A stop string the call's own JSON holds (the city asked about, the call's tag)
    would cut the arguments into JSON that does not parse: calls lie out of their reach."""
    reply = (
        oai(server)
        .chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "Weather in Oslo?"}],
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            stop=["Oslo", '"', "<tool_call>"],
            temperature=0,
            max_tokens=60,
        )
        .choices[0]
    )
    assert reply.finish_reason == "tool_calls"
    [call] = reply.message.tool_calls or []
    assert call.type == "function"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_a_reply_beside_tools_under_auto_is_calls_or_an_answer_of_the_format(
    server: ServerProcess,
) -> None:
    """Tools the reply may call and a response format (the OpenAI Agents SDK sends both
    for an agent with tools and an output type): the reply is calls, or JSON of the
    format, never free text (which this model writes here without the format), streamed
    or not."""
    joke = {
        "type": "object",
        "properties": {"joke": {"type": "string", "maxLength": 80}},
        "required": ["joke"],
        "additionalProperties": False,
    }
    body: dict[str, Any] = {
        "model": "default",
        "messages": [{"role": "user", "content": "Tell me a joke."}],
        "tools": TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "joke", "strict": True, "schema": joke},
        },
        "temperature": 0,
        "max_tokens": 60,
    }
    reply = oai(server).chat.completions.create(**body).choices[0]
    for call in reply.message.tool_calls or []:
        assert call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    if not reply.message.tool_calls:
        jsonschema.validate(json.loads(reply.message.content or ""), joke)
    chunks = list(oai(server).chat.completions.create(**body, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == (reply.message.content or "")
    free = {k: v for k, v in body.items() if k != "response_format"}
    unformatted = oai(server).chat.completions.create(**free).choices[0].message
    assert not unformatted.tool_calls  # free text here: what the format changes
    assert unformatted.content


def test_anthropic_tool_use_round_trip(server: ServerProcess) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="unused")
    tools: list[Any] = [
        {"name": "get_weather", "description": "Weather forecast", "input_schema": WEATHER}
    ]
    asked: list[Any] = [{"role": "user", "content": "What is the weather in Lima?"}]
    body: dict[str, Any] = {
        "model": "default",
        "max_tokens": 120,
        "tools": tools,
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},  # one call, whole
        "extra_body": {"temperature": 0},
    }
    reply = client.messages.create(messages=asked, **body)
    assert reply.stop_reason == "tool_use"
    used = [b for b in reply.content if b.type == "tool_use"]
    assert used
    assert all(b.id.startswith("toolu_") for b in used)
    for block in used:
        jsonschema.validate(block.input, WEATHER)
    with client.messages.stream(messages=asked, **body) as stream:
        streamed = stream.get_final_message()
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [
        (b.name, b.input) for b in used
    ]
    results = [
        {"type": "tool_result", "tool_use_id": b.id, "content": [{"type": "text", "text": "Sunny"}]}
        for b in used
    ]
    history = [
        *asked,
        {"role": "assistant", "content": [b.model_dump() for b in reply.content]},  # as dumped
        {"role": "user", "content": results},
    ]
    final = client.messages.create(
        messages=history, **{**body, "tool_choice": {"type": "none"}, "max_tokens": 30}
    )
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert final.content[0].type == "text"
    before = (
        reply.usage.input_tokens
        + (reply.usage.cache_read_input_tokens or 0)
        + reply.usage.output_tokens
    )
    assert (final.usage.cache_read_input_tokens or 0) >= 0.95 * before


def test_a_loose_tool_with_keywords_no_grammar_honours_is_called_and_a_strict_one_refused(
    server: ServerProcess,
) -> None:
    """zod's ``z.never()`` writes ``not: {}``, and JSON Schema's conditionals are common in
    MCP tools: OpenAI's and Anthropic's non-strict tools take them, and so does this
    server (the call is generated under the rest of the schema); a strict tool, whose
    calls must validate, is refused naming the keyword, on both doors."""
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "not": {"const": ""}},
            "unit": {"enum": ["C", "F"], "if": {"const": "F"}, "then": {}},
            "never": {"not": {}},
        },
        "required": ["city", "unit"],
    }
    asked: list[Any] = [{"role": "user", "content": "Weather in Lima?"}]
    client = oai(server)
    ask: dict[str, Any] = {"model": "default", "messages": asked, "max_tokens": 60}
    ask |= {"temperature": 0, "tool_choice": "required"}
    function = {"name": "get_weather", "parameters": schema}
    loose: Any = [{"type": "function", "function": function}]
    reply = client.chat.completions.create(**ask, tools=loose)
    [call] = reply.choices[0].message.tool_calls or []
    arguments = json.loads(call.function.arguments)
    assert {"city", "unit"} <= set(arguments)
    assert arguments["unit"] in ("C", "F")
    strict: Any = [{"type": "function", "function": {**function, "strict": True}}]
    with pytest.raises(openai.BadRequestError, match="'not'"):
        client.chat.completions.create(**ask, tools=strict)
    said = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    tool: Any = {
        "name": "get_weather",
        "input_schema": schema,
        "input_examples": [{"city": "Oslo", "unit": "C"}],
        "eager_input_streaming": True,
    }
    one_call: Any = {"type": "any", "disable_parallel_tool_use": True}
    used = said.messages.create(
        model="default", max_tokens=100, messages=asked, tools=[tool], tool_choice=one_call
    )
    assert used.stop_reason == "tool_use", used
    [block] = [b for b in used.content if b.type == "tool_use"]
    assert {"city", "unit"} <= set(cast("dict[str, Any]", block.input))
    held: Any = [{**tool, "strict": True}]
    with pytest.raises(anthropic.BadRequestError, match="'not'"):
        said.messages.create(
            model="default", max_tokens=60, messages=asked, tools=held, tool_choice=one_call
        )


def test_json_schema_strict_validates_and_json_object_parses_20_of_20(
    server: ServerProcess,
) -> None:
    client = oai(server)
    people = [
        f"Describe a person named {n} who likes {h}."
        for n in ("Ann", "Bo", "Cy", "Di", "Ed")
        for h in ("chess", "tea", "maps", "boats")
    ]
    strict = {
        "type": "json_schema",
        "json_schema": {"name": "person", "strict": True, "schema": PERSON},
    }

    def ask(fmt: Any) -> Callable[[str], Any]:
        return lambda prompt: client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": prompt}],
            response_format=fmt,
            temperature=0,
            max_tokens=300,
        )

    for reply in each(people, ask(strict)):
        assert reply.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(reply.choices[0].message.content or ""), PERSON)
    as_json = [  # OpenAI asks that such a request say "JSON"
        f'Reply in JSON with the keys "name" and "hobby": a person named {n} who likes {h}.'
        for n in ("Ann", "Bo", "Cy", "Di", "Ed")
        for h in ("chess", "tea", "maps", "boats")
    ]
    for reply in each(as_json, ask({"type": "json_object"})):
        assert reply.choices[0].finish_reason == "stop"
        assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)


def test_an_agents_calls_and_results_are_kept_in_its_transcript_and_forks(
    server: ServerProcess,
) -> None:
    api = f"{server.url}/v1/agents"
    agent = f"caller-{uuid.uuid4().hex[:8]}"
    assert (
        httpx.post(api, json={"id": agent, "system_prompt": "You help with weather."}).status_code
        == 201
    )
    called = httpx.post(
        f"{api}/{agent}/messages",
        json={
            "content": "Weather in Tokyo?",
            "tools": TOOLS,
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "max_tokens": 120,
        },
        timeout=120,
    ).json()
    assert called["finish_reason"] == "tool_calls"
    [call] = called["tool_calls"]
    jsonschema.validate(
        json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]]
    )
    answered = httpx.post(
        f"{api}/{agent}/messages",
        json={
            "role": "tool",
            "tool_call_id": call["id"],
            "content": "Rain",
            "tools": TOOLS,
            "tool_choice": "none",
            "max_tokens": 20,
        },
        timeout=120,
    ).json()
    assert answered["finish_reason"] in ("stop", "length")
    before = called["usage"]["prompt_tokens"] + called["usage"]["completion_tokens"]
    assert answered["usage"]["cached_tokens"] >= 0.95 * before
    assert httpx.post(f"{api}/{agent}/fork", json={"id": f"{agent}-b"}).status_code == 201
    for name in (agent, f"{agent}-b"):
        listed = httpx.get(f"{api}/{name}/messages").json()["data"]
        assert [m["role"] for m in listed] == ["user", "assistant", "tool", "assistant"]
        assert listed[1]["tool_calls"][0]["id"] == call["id"]
        assert listed[2]["tool_call_id"] == call["id"]


def test_the_openai_agents_sdk_runs_a_function_tool_and_a_handoff(server: ServerProcess) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(
        model="default",
        openai_client=openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused"),
    )
    called: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        called.append(city)
        return f"Sunny in {city}"

    settings = ModelSettings(temperature=0, max_tokens=60, tool_choice="required")
    agent = Agent(
        name="weather",
        instructions="Use the tool.",
        tools=[get_weather],
        model=model,
        model_settings=settings,
    )
    result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=5)
    assert called
    assert isinstance(result.final_output, str)
    assert result.final_output
    french = Agent(
        name="french",
        instructions="Answer in French.",
        model=model,
        model_settings=ModelSettings(temperature=0, max_tokens=20),
    )
    triage = Agent(
        name="triage",
        instructions="Hand off to french.",
        handoffs=[french],
        model=model,
        model_settings=settings,
    )
    handed = Runner.run_sync(triage, "Bonjour!", max_turns=5)
    assert handed.last_agent.name == "french"
    assert handed.final_output


def test_anthropic_structured_output_parses_and_refuses_what_it_cannot_serve(
    server: ServerProcess,
) -> None:
    """``output_config.format`` (the SDK's ``messages.parse(output_format=...)``): the
    reply's text is JSON of the schema; ``effort`` and malformed formats are a 400 naming
    ``output_config``."""
    from pydantic import BaseModel, Field

    class City(BaseModel):
        name: str = Field(max_length=30)
        country: str = Field(max_length=30)

    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    ask: dict[str, Any] = {
        "model": "default",
        "max_tokens": 60,
        "messages": [{"role": "user", "content": "Paris is in France."}],
        "extra_body": {"temperature": 0},  # this SDK's parse takes no temperature
    }
    parsed = client.messages.parse(**ask, output_format=City)
    assert parsed.stop_reason == "end_turn"
    assert isinstance(parsed.parsed_output, City)
    malformed: list[Any] = [
        {"effort": "high"},
        {"format": {"type": "json_object"}},
        {"format": {"type": "json_schema", "schema": {"not": {}}}},
        {"format": {"type": "json_schema", "schema": {}}, "extra": 1},
    ]
    for config in malformed:
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.messages.create(**ask, output_config=config)
        assert "output_config" in str(refused.value)
    counted = client.messages.count_tokens(
        model="default",
        messages=ask["messages"],
        output_config={"format": {"type": "json_schema", "schema": City.model_json_schema()}},
    )
    assert counted.input_tokens > 0


def test_a_schema_no_reply_can_be_held_to_is_named_by_each_front_doors_field(
    server: ServerProcess,
) -> None:
    """A look-ahead pattern (refused up front where the reply must validate) and an integer
    range wider than 64 bits (refused when the grammar compiles): a 400 that says why,
    naming the request's own field on every front door; a non-strict format leaves out
    only what the grammar cannot honour."""
    looks_ahead = {
        "type": "object",
        "properties": {"a": {"type": "string", "pattern": "(?=a)b"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    too_wide = {**looks_ahead, "properties": {"a": {"type": "integer", "minimum": -(2**70)}}}
    client = oai(server)
    ask: dict[str, Any] = {"model": "default", "temperature": 0}
    said = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    for schema, why in ((looks_ahead, "look-around"), (too_wide, "integer range")):
        with pytest.raises(openai.BadRequestError) as chat:
            client.chat.completions.create(
                **ask,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=5,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "a", "strict": True, "schema": schema},
                },
            )
        with pytest.raises(openai.BadRequestError) as responses:
            client.responses.create(
                **ask,
                input="hi",
                max_output_tokens=16,
                text={
                    "format": {"type": "json_schema", "name": "a", "strict": True, "schema": schema}
                },
            )
        with pytest.raises(anthropic.BadRequestError) as messages:
            said.messages.create(
                model="default",
                max_tokens=5,
                messages=[{"role": "user", "content": "hi"}],
                output_config={"format": {"type": "json_schema", "schema": schema}},
            )
        refusals = {
            "response_format": chat.value,
            "text.format": responses.value,
            "output_config": messages.value,
        }
        for field, refusal in refusals.items():
            assert why in str(refusal), refusal
            assert field in str(refusal), refusal
        assert chat.value.param == "response_format"
        assert responses.value.param == "text"
    inner_not = {
        "type": "object",
        "properties": {"a": {"type": "integer", "not": {"const": 3}}},
        "required": ["a"],
        "additionalProperties": False,
    }
    loose = client.chat.completions.create(
        **ask,
        messages=[{"role": "user", "content": "Give a number as JSON."}],
        max_tokens=30,
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": inner_not}},
    )
    assert set(json.loads(loose.choices[0].message.content or "")) == {"a"}
    unchecked = client.chat.completions.create(  # without strict, the look-ahead is left out
        **ask,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=30,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "a", "schema": looks_ahead},
        },
    )
    assert isinstance(json.loads(unchecked.choices[0].message.content or "")["a"], str)


def test_a_turn_after_calls_cut_by_max_tokens_is_what_a_cold_run_gives(
    server: ServerProcess,
) -> None:
    """A reply cut after a whole call drops what followed it; the next turn is built from
    what the client was shown, as a cold run of the conversation is, not from the dropped
    text the cache still holds (an agent's transcript and a plain conversation alike)."""
    city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    weather = {"name": "get_weather", "description": "Weather for a city", "parameters": city}
    tools: list[Any] = [{"type": "function", "function": weather}]
    asked: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    body: dict[str, Any] = {"model": "default", "tools": tools, "temperature": 0}
    warm = oai(server).with_options(default_headers={"X-Agent-Id": f"cut-{uuid.uuid4().hex}"})
    first = warm.chat.completions.create(
        **body, messages=asked, tool_choice="required", max_tokens=40
    ).choices[0]
    assert first.finish_reason == "length"
    [call] = first.message.tool_calls or []
    assert is_json(call.function.arguments)  # whole; what came after it was dropped
    result = {"role": "tool", "tool_call_id": call.id, "content": "20 C"}
    follow = [*asked, first.message.model_dump(exclude_none=True), result]
    follow.append({"role": "user", "content": "Is it warm?"})
    again = warm.chat.completions.create(**body, messages=follow, max_tokens=12)
    cold_client = oai(server).with_options(default_headers={"X-Namespace": uuid.uuid4().hex})
    cold = cold_client.chat.completions.create(**body, messages=follow, max_tokens=12)
    assert again.usage is not None
    assert cold.usage is not None
    assert again.usage.prompt_tokens == cold.usage.prompt_tokens
    assert again.choices[0].message.content == cold.choices[0].message.content
