"""The official openai and anthropic clients against a real server."""

from __future__ import annotations

import json
import time

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from reliability.server import ServerProcess

from tests.e2e.sdk_types import anthropic_messages, openai_messages
from tests.helpers import huge_pages_expected

pytestmark = pytest.mark.model

QUESTION = "What is the capital of France?"
GREEDY = {"temperature": 0}  # anthropic>=2 clients no longer send temperature themselves


def oai(server: ServerProcess, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", default_headers=headers)


def test_openai_chat_answers_without_and_with_streaming(server: ServerProcess) -> None:
    client = oai(server)
    reply = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": QUESTION}],
        temperature=0,
        max_tokens=24,
    )
    assert "Paris" in (reply.choices[0].message.content or "")
    assert reply.choices[0].finish_reason == "stop"
    assert reply._request_id is not None  # noqa: SLF001 - the SDK's name for the header's id
    assert reply._request_id.startswith("req_")  # noqa: SLF001
    stream = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": QUESTION}],
        temperature=0,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens  # type: ignore[union-attr]


def test_openai_completions_and_models(server: ServerProcess) -> None:
    client = oai(server)
    assert [m.id for m in client.models.list().data] == ["smollm2-135m-instruct"]
    theirs = anthropic.Anthropic(base_url=server.url, api_key="unused").models.list().data
    assert [(m.type, m.id, m.display_name) for m in theirs] == [
        ("model",) + ("smollm2-135m-instruct",) * 2
    ]
    assert theirs[0].created_at.tzinfo is not None
    runtime = (client.models.retrieve("smollm2-135m-instruct").model_extra or {})["runtime"]
    assert "core " in runtime["blas"] or not runtime["blas"].startswith("OpenBLAS")
    assert runtime["device"] == "cpu"
    assert runtime["kv_memory"] == "host views (the model runs on the CPU)"
    said = runtime["accelerations"]
    assert said["host softmax attention (ADR 0008)"] == "on"
    assert all(value.startswith(("on", "off: ")) for value in said.values())
    done = client.completions.create(
        model="default", prompt="The capital of France is", max_tokens=4, temperature=0
    )
    assert done.choices[0].text
    assert done.usage is not None
    assert done.usage.completion_tokens <= 4
    counting = "Numbers: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
    as_ids = client.completions.create(model="default", prompt=[1], max_tokens=1, temperature=0)
    assert as_ids.usage is not None
    assert as_ids.usage.prompt_tokens == 1
    by_default = client.completions.create(model="default", prompt=counting, temperature=0)
    assert by_default.usage is not None
    assert by_default.usage.completion_tokens == 16  # OpenAI's default for completions
    body = {"model": "default", "max_tokens": 1}
    for prompt, says in (
        ([49152], "outside the vocabulary"),
        ([[1], [2]], "exactly one prompt"),
        ([5.0], "a string, or token ids"),
        ([[1, None]], "a string, or token ids"),
    ):
        refused = httpx.post(f"{server.url}/v1/completions", json={**body, "prompt": prompt})
        assert refused.status_code == 400
        assert says in refused.json()["error"]["message"]
        assert refused.json()["error"]["param"] == "prompt"


def test_stop_sequences_are_cut_in_both_protocols(server: ServerProcess) -> None:
    reply = oai(server).chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": QUESTION}],
        temperature=0,
        max_tokens=24,
        stop=["Paris"],
    )
    assert "Paris" not in (reply.choices[0].message.content or "")
    message = anthropic.Anthropic(base_url=server.url, api_key="unused").messages.create(
        model="default",
        max_tokens=24,
        stop_sequences=["Paris"],
        extra_body=GREEDY,
        messages=[{"role": "user", "content": QUESTION}],
    )
    assert message.stop_reason == "stop_sequence"
    assert message.stop_sequence == "Paris"
    assert "Paris" not in message.content[0].text  # type: ignore[union-attr]
    empty = {"model": "default", "max_tokens": 1, "stop_sequences": [""]}
    empty["messages"] = [{"role": "user", "content": QUESTION}]
    refused = httpx.post(f"{server.url}/v1/messages", json=empty)
    assert refused.status_code == 400
    assert "stop_sequences strings must not be empty" in refused.json()["error"]["message"]


def test_anthropic_messages_stream_and_count_tokens(server: ServerProcess) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="unused")
    with client.messages.stream(
        model="default",
        max_tokens=24,
        extra_body=GREEDY,
        system="Answer in one sentence.",
        messages=[{"role": "user", "content": QUESTION}],
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert "Paris" in text
    assert final.stop_reason == "end_turn"
    count = client.messages.count_tokens(
        model="default", messages=[{"role": "user", "content": QUESTION}]
    )
    assert count.input_tokens > 10
    assert (count._request_id or "").startswith("req_")  # noqa: SLF001 - the SDK's name for it


def test_an_anthropic_reply_continues_a_final_assistant_message(server: ServerProcess) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="unused")
    asked = {"role": "user", "content": QUESTION}
    prefilled = {"role": "assistant", "content": "The capital of France is"}
    reply = client.messages.create(
        model="default",
        max_tokens=4,
        extra_body=GREEDY,
        messages=anthropic_messages([asked, prefilled]),
    )
    text = reply.content[0].text  # type: ignore[union-attr]  # a text block: no tools here
    assert "Paris" in text
    assert "capital" not in text
    spaced = {"role": "assistant", "content": "The capital of France is "}
    with pytest.raises(anthropic.BadRequestError, match="trailing whitespace"):
        client.messages.create(
            model="default", max_tokens=4, messages=anthropic_messages([asked, spaced])
        )
    empty = anthropic_messages([{"role": "assistant", "content": ""}])  # found by the fuzzer
    with pytest.raises(anthropic.BadRequestError, match="a user message"):
        client.messages.create(model="default", max_tokens=4, messages=empty)
    with pytest.raises(anthropic.BadRequestError, match="a user message"):
        client.messages.count_tokens(model="default", messages=empty)


def test_later_turns_of_a_conversation_report_cached_tokens(server: ServerProcess) -> None:
    client = oai(server, **{"X-Agent-Id": "traveller"})
    history: list[dict[str, str]] = [{"role": "user", "content": QUESTION}]
    first = client.chat.completions.create(
        model="default", messages=openai_messages(history), temperature=0, max_tokens=24
    )
    history += [
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "And of Italy?"},
    ]
    second = client.chat.completions.create(
        model="default", messages=openai_messages(history), temperature=0, max_tokens=24
    )
    assert first.usage is not None
    assert second.usage is not None
    assert second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens or 0
    assert cached >= first.usage.prompt_tokens + first.usage.completion_tokens - 1
    anthropic_client = anthropic.Anthropic(base_url=server.url, api_key="unused")
    again = anthropic_client.messages.create(
        model="default", max_tokens=8, messages=anthropic_messages(history)
    )
    assert (again.usage.cache_read_input_tokens or 0) >= cached
    body = {"model": "default", "max_tokens": 2, "stream": True}
    with httpx.stream(
        "POST",
        f"{server.url}/v1/messages",
        json={**body, "messages": anthropic_messages(history)},
        timeout=60,
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in response.iter_lines() if line[:6] == "data: "]
    started = events[0]["message"]["usage"]  # clients read the input's figures here
    ended = next(e for e in events if e["type"] == "message_delta")["usage"]
    assert started["cache_read_input_tokens"] == ended["cache_read_input_tokens"] >= cached
    assert started["input_tokens"] == ended["input_tokens"]


def test_errors_come_in_each_protocols_shape(server: ServerProcess) -> None:
    bad = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={
            "model": "default",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [TOOL, TOOL],
        },
    )
    assert bad.status_code == 400
    assert "used twice" in bad.json()["error"]["message"]
    assert bad.json()["error"]["param"] == "tools"
    assert bad.headers["x-request-id"].startswith("req_")  # what a user quotes, refused too
    empty = httpx.post(f"{server.url}/v1/chat/completions")
    assert empty.status_code == 400
    assert "the body is empty" in empty.json()["error"]["message"]
    mistyped = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "default", "messages": [{"role": "user", "content": "x"}], "top_p": "hi"},
    )
    assert mistyped.status_code == 400
    assert mistyped.json()["error"]["param"] == "top_p"
    assert "at `top_p`" in mistyped.json()["error"]["message"]
    missing = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]},
    )
    assert missing.status_code == 404
    nothing = httpx.post(  # a ceiling is lowered to what the server gives; none is refused
        f"{server.url}/v1/messages",
        json={
            "model": "default",
            "max_tokens": 0,
            "messages": [{"role": "user", "content": "x"}],
        },
    )
    assert nothing.status_code == 400
    assert nothing.json()["type"] == "error"
    assert nothing.json()["error"]["type"] == "invalid_request_error"


TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


def test_openai_fields_at_neutral_values_are_served_and_others_named(
    server: ServerProcess,
) -> None:
    """Clients fill in OpenAI fields this server does not implement; at their neutral values
    the request is served, else the 400 names what is missing."""
    body = {"model": "default", "messages": [{"role": "user", "content": "Hi"}]}
    neutral = {
        "max_tokens": 2,
        "tools": [],
        "tool_choice": "none",
        "response_format": {"type": "text"},
        "metadata": {"run": "1"},
        "store": False,
        "top_logprobs": 0,
        "logit_bias": {"50256": 0},
        "functions": [],
        "function_call": "none",
        "audio": None,
        "verbosity": "medium",  # OpenAI's default
        "reasoning_effort": "none",  # what this model does
        "web_search_options": None,
        "top_k": -1,
    }
    served = httpx.post(f"{server.url}/v1/chat/completions", json={**body, **neutral}, timeout=60)
    assert served.status_code == 200
    for field, value, named in (
        ("response_format", {"type": "xml"}, "response_format: type must be"),
        ("max_tokens", 0, "max_tokens must be between 1"),
        ("max_completion_tokens", 0, "max_completion_tokens must be at least 1"),
        ("logit_bias", {"50256": -100}, "logit_bias names token 50256, outside the vocabulary"),
        ("logit_bias", {"cat": 5}, "logit_bias keys are token ids"),
        ("frequency_penalty", 2.5, "frequency_penalty must be between -2 and 2"),
        ("presence_penalty", -3, "presence_penalty must be between -2 and 2"),
        ("function_call", {"name": "get_weather"}, "function_call names a function"),
        ("functions", [{"name": "f", "strict": True}], "a function has no field 'strict'"),
        ("frobnicate", 1, "unknown field `frobnicate`"),
        ("audio", {"voice": "alloy", "format": "mp3"}, "audio"),
        ("reasoning_effort", "high", "reasoning_effort='high' is not supported"),
        ("top_k", -2, "top_k must be 0 or more"),
    ):
        refused = httpx.post(f"{server.url}/v1/chat/completions", json={**body, field: value})
        assert refused.status_code == 400, field
        assert named in refused.json()["error"]["message"]
        assert refused.json()["error"]["param"] == field


def test_metrics_parse_and_move_with_traffic(server: ServerProcess) -> None:
    before = server.metric("semantic_prompt_tokens_total")
    oai(server).chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Say hi."}],
        temperature=0,
        max_tokens=4,
    )
    text = httpx.get(f"{server.url}/metrics").text
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {
        "semantic_time_to_first_token_seconds",
        "semantic_inter_token_latency_seconds",
        "semantic_request_duration_seconds",
        "semantic_queue_time_seconds",
        "semantic_requests_running",
        "semantic_requests_waiting",
        "semantic_kv_pool_used_blocks",
        "semantic_prefix_cache_queried_tokens",
        "semantic_prefix_cache_hit_tokens",
        "semantic_restored_tokens",
        "semantic_corrupt_blocks",
        "semantic_saves_failed",
        "semantic_requests_abandoned",
    } <= names
    assert server.metric("semantic_prompt_tokens_total") > before
    hits = server.metric("semantic_prefix_cache_hit_tokens_total")
    reported = server.metric("semantic_prompt_cached_tokens_total")
    again = oai(server).chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Say hi."}],
        temperature=0,
        max_tokens=4,
    )
    assert again.usage is not None
    assert again.usage.prompt_tokens_details is not None
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert server.metric("semantic_prefix_cache_hit_tokens_total") - hits == cached
    assert server.metric("semantic_prompt_cached_tokens_total") - reported == cached
    refusals = {"status": "400", "code": "invalid_request"}

    def refused() -> float:
        try:
            return server.metric("semantic_requests_refused_total", refusals)
        except KeyError:  # none yet
            return 0.0

    before_refusals = refused()
    bad = {"model": "default", "max_tokens": 0, "messages": [{"role": "user", "content": "Hi"}]}
    assert httpx.post(f"{server.url}/v1/chat/completions", json=bad).status_code == 400
    assert refused() == before_refusals + 1


def test_a_client_that_disconnects_mid_stream_frees_its_blocks(server: ServerProcess) -> None:
    baseline = server.metric("semantic_kv_pool_used_blocks")
    body = {
        "model": "default",
        "stream": True,
        "max_tokens": 400,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
    }
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json=body, timeout=60
    ) as response:
        for line in response.iter_lines():
            if '"content": "' in line and '"content": ""' not in line:
                break
    for _ in range(100):
        if server.metric("semantic_kv_pool_used_blocks") == baseline:
            break
        httpx.get(f"{server.url}/health")
    assert server.metric("semantic_kv_pool_used_blocks") == baseline


def test_a_reply_sent_back_as_the_sdk_dumps_it_continues_the_conversation(
    server: ServerProcess,
) -> None:
    client = oai(server)
    asked = {"role": "user", "content": QUESTION}
    reply = client.chat.completions.create(
        model="default", messages=openai_messages([asked]), temperature=0, max_tokens=2
    )
    dumped = reply.choices[0].message.model_dump()  # refusal, tool_calls, audio... as null
    assert {"refusal", "tool_calls"} <= dumped.keys()
    more = {"role": "user", "content": "Thanks."}
    again = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "default", "max_tokens": 1, "messages": [asked, dumped, more]},
        timeout=60,
    )
    assert again.status_code == 200, again.text
    dumped["tool_calls"] = [{"id": "1", "type": "function", "function": TOOL["function"]}]
    refused = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "default", "max_tokens": 1, "messages": [asked, dumped, more]},
    )
    assert refused.status_code == 400  # a call without its arguments
    assert "arguments must be a string" in refused.json()["error"]["message"]


def test_content_parts_are_read_as_text_or_refused_by_their_kind(server: ServerProcess) -> None:
    """As SDKs dump history: Anthropic text blocks carry ``citations: null``; LiteLLM puts
    ``cache_control`` on OpenAI parts. Parts of kinds not served are refused by kind."""
    client = anthropic.Anthropic(base_url=server.url, api_key="unused")
    asked = {"role": "user", "content": [{"type": "text", "text": QUESTION, "citations": None}]}
    reply = client.messages.create(model="default", max_tokens=2, messages=[asked])  # type: ignore[list-item]  # a dict as clients send it
    dumped = {"role": "assistant", "content": [block.model_dump() for block in reply.content]}
    assert "citations" in dumped["content"][0]
    more = {"role": "user", "content": "Thanks."}
    body = {"model": "default", "max_tokens": 1, "messages": [asked, dumped, more]}
    assert httpx.post(f"{server.url}/v1/messages", json=body, timeout=60).status_code == 200
    tool_use = {"type": "tool_use", "id": "t1", "name": "look", "input": {}}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    for block in (tool_use, image):
        body["messages"] = [{"role": "user", "content": [block]}]
        refused = httpx.post(f"{server.url}/v1/messages", json=body)
        assert refused.status_code == 400
        assert f"type {block['type']!r} is not supported" in refused.json()["error"]["message"]
    cached = {"type": "text", "text": QUESTION, "cache_control": {"type": "ephemeral"}}
    chat = {"model": "default", "max_tokens": 1}
    chat["messages"] = [{"role": "user", "content": [cached]}]
    served = httpx.post(f"{server.url}/v1/chat/completions", json=chat, timeout=60)
    assert served.status_code == 200, served.text
    picture = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    bogus = {**cached, "cache_control": {"type": "bogus"}}
    for parts, says in (
        ([picture], "type 'image_url' is not supported"),
        ([{"type": "text"}], "needs"),
        ([{"type": "refusal", "refusal": "No."}], "only an assistant's"),
        ([], "must not be empty"),
        ([bogus], "cache_control type 'bogus'"),
    ):
        chat["messages"] = [{"role": "user", "content": parts}]
        refused = httpx.post(f"{server.url}/v1/chat/completions", json=chat)
        assert refused.status_code == 400
        assert says in refused.json()["error"]["message"]
        assert refused.json()["error"]["param"] == "messages"
    body["messages"] = [{"role": "user", "content": []}]
    assert httpx.post(f"{server.url}/v1/messages", json=body).status_code == 400
    body["messages"] = [asked, {"role": "assistant", "content": []}]  # an empty prefill
    assert httpx.post(f"{server.url}/v1/messages", json=body, timeout=60).status_code == 200


def test_streams_are_event_streams_and_bad_bodies_are_client_errors(server: ServerProcess) -> None:
    chat_body = {"model": "default", "max_tokens": 1, "stream": True}
    chat_body["messages"] = [{"role": "user", "content": "Hi"}]
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json=chat_body, timeout=60
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert any(line == "data: [DONE]" for line in response.iter_lines())
    deep_value = "[" * 5000 + "]" * 5000  # where a body takes any JSON (a tool's schema, say)
    as_json = {"content-type": "application/json"}
    for path, field in (("/v1/chat/completions", "prediction"), ("/v1/messages", "metadata")):
        nested = f'{{"model": "default", "{field}": {{"a": {deep_value}}}, "messages": []}}'
        deep = httpx.post(f"{server.url}{path}", content=nested, headers=as_json)
        assert deep.status_code == 400, path
        assert "nested too deeply" in deep.text
    # Certainly over the context by its size alone: refused before it is tokenized.
    huge = {"model": "default", "messages": [{"role": "user", "content": "a " * 1_500_000}]}
    refused = httpx.post(f"{server.url}/v1/chat/completions", json=huge, timeout=60)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    assert "at least" in refused.json()["error"]["message"]
    too_long = httpx.post(f"{server.url}/v1/messages", json={**huge, "max_tokens": 5}, timeout=60)
    assert too_long.status_code == 400
    assert too_long.json()["error"]["message"].startswith("prompt is too long: ")
    for path, limit in (("/v1/chat/completions", 2), ("/v1/messages", 1)):
        body = {"model": "default", "max_tokens": 1, "messages": chat_body["messages"]}
        for temperature in (limit + 0.5, -0.01):
            refused = httpx.post(f"{server.url}{path}", json={**body, "temperature": temperature})
            assert refused.status_code == 400, path
            assert f"between 0 and {limit}," in refused.text
    chat_url = f"{server.url}/v1/chat/completions"
    truncated = httpx.post(chat_url, content=b'{"model": ', headers=as_json)
    assert truncated.status_code == 400
    assert truncated.json()["error"]["code"] == "invalid_request"
    assert "not valid JSON" in truncated.json()["error"]["message"]
    lone = b'{"model": "default", "messages": [{"role": "user", "content": "\\ud800x"}]}'
    surrogate = httpx.post(f"{server.url}/v1/chat/completions", content=lone, headers=as_json)
    assert surrogate.status_code == 400
    assert "unpaired surrogate" in surrogate.json()["error"]["message"], "not just 'truncated'"
    twice = [("X-Namespace", "team-a"), ("X-Namespace", "team-b")]
    ambiguous = httpx.post(f"{server.url}/v1/chat/completions", json=chat_body, headers=twice)
    assert ambiguous.status_code == 400
    assert "X-Namespace header is given 2 times" in ambiguous.json()["error"]["message"]
    shouted = {"X-Priority": "urgent" * 1000}
    too_loud = httpx.post(f"{server.url}/v1/chat/completions", json=chat_body, headers=shouted)
    assert too_loud.status_code == 400
    assert "(6000 characters)" in too_loud.json()["error"]["message"]
    assert len(too_loud.content) < 1000
    named = {b"X-Agent-Id": "エージェント".encode()}
    unicode_id = httpx.post(f"{server.url}/v1/chat/completions", json=chat_body, headers=named)
    assert "'エージェント'" in unicode_id.json()["error"]["message"]
    wrong_method = httpx.delete(f"{server.url}/v1/chat/completions")
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"]["type"] == "invalid_request_error"
    assert "POST" in wrong_method.headers["allow"].split(", ")
    assert "DELETE is not allowed on /v1/chat/completions; allowed: " in wrong_method.text


def test_a_value_of_the_wrong_json_type_is_refused_not_converted(server: ServerProcess) -> None:
    """``"max_tokens": "5"`` is a 400 naming the field, as OpenAI and Anthropic answer it:
    read as what it spells, the server would run a request its client never sent."""
    as_json = {"content-type": "application/json"}
    oversized = b'{"model": "' + b"x" * (5 << 20)
    too_big = httpx.post(f"{server.url}/v1/chat/completions", content=oversized, headers=as_json)
    assert too_big.status_code == 413
    assert "limit of 4 MiB" in too_big.json()["error"]["message"]
    chat = {"model": "default", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}
    wrong = (
        ("max_tokens", "5", "got `str`"),
        ("max_tokens", 5.0, "got `float`"),
        ("stream", "true", "got `str`"),
        ("temperature", "0", "got `str`"),
    )
    for path in ("/v1/chat/completions", "/v1/messages", "/v1/completions"):
        body = {**chat, "prompt": "Hi"} if path == "/v1/completions" else chat
        if path == "/v1/completions":
            del body["messages"]
        for field, value, says in wrong:
            refused = httpx.post(f"{server.url}{path}", json={**body, field: value}, timeout=60)
            assert refused.status_code == 400, (path, field, refused.text)
            error = refused.json()["error"]
            assert says in error["message"], error
            assert f"at `{field}`" in error["message"], error
            assert path == "/v1/messages" or error["param"] == field
    nested = {**chat, "messages": [{"role": "user", "content": 5}]}
    refused = httpx.post(f"{server.url}/v1/chat/completions", json=nested)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "messages[0].content"


def test_an_endpoint_this_server_lacks_is_refused_with_what_it_has(server: ServerProcess) -> None:
    with pytest.raises(openai.NotFoundError) as not_served:
        oai(server).embeddings.create(model="default", input="hi")
    message = not_served.value.body["message"]  # type: ignore[index]  # the SDK's: object
    assert "no endpoint at POST /v1/embeddings" in message
    assert "/v1/chat/completions" in message


def test_models_health_and_neutral_fields_of_every_endpoint(server: ServerProcess) -> None:
    client = oai(server)
    assert client.models.retrieve("default").id == "smollm2-135m-instruct"
    assert httpx.get(f"{server.url}/v1/models/gpt-4").status_code == 404
    hub_style = httpx.get(f"{server.url}/v1/models/org/name")  # ids with a slash are ids
    assert "model 'org/name' is not served here" in hub_style.json()["error"]["message"]
    for path in ("/health", "/metrics", "/v1/models", "/v1/models/default"):
        head = httpx.head(f"{server.url}{path}")
        assert (head.status_code, head.content) == (200, b""), path
    metrics_type = httpx.get(f"{server.url}/metrics").headers["content-type"]
    assert metrics_type.count("charset") == 1
    messages = [{"role": "user", "content": "Hi"}]
    anthropic_neutral = {
        "tools": [],
        "tool_choice": {"type": "none"},
        "thinking": {"type": "disabled"},
        "top_k": 5,
    }
    served = httpx.post(
        f"{server.url}/v1/messages",
        json={"model": "default", "max_tokens": 1, "messages": messages, **anthropic_neutral},
        timeout=60,
    )
    assert served.status_code == 200, served.text
    thinking = {"model": "default", "max_tokens": 1, "messages": messages}
    thinking["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    refused = httpx.post(f"{server.url}/v1/messages", json=thinking)
    assert refused.status_code == 400
    assert "thinking is not supported" in refused.json()["error"]["message"]
    completion = {"model": "default", "max_tokens": 1, "prompt": "Hi", "echo": False}
    completion |= {"best_of": 1, "suffix": None, "stream": None}
    assert httpx.post(f"{server.url}/v1/completions", json=completion, timeout=60).is_success
    for field, value in (("logprobs", 21), ("echo", True)):
        named = httpx.post(f"{server.url}/v1/completions", json={**completion, field: value})
        assert (named.status_code, named.json()["error"]["param"]) == (400, field)
    for n_words in (9_000, 400_000):  # counted, and certainly too long by its size alone
        too_long = {**completion, "prompt": "Hi " * n_words}
        refused = httpx.post(f"{server.url}/v1/completions", json=too_long, timeout=60)
        assert refused.json()["error"]["param"] == "prompt"


def test_a_plain_reply_whose_client_timed_out_stops_generating(server: ServerProcess) -> None:
    """SDKs time out and retry: the first request must not generate on for nobody."""
    abandoned = server.metric("semantic_requests_abandoned_total")
    finished = server.metric("semantic_requests_total")
    unexpected = server.log.read_text().count("unexpected error")
    body = {"model": "default", "max_tokens": 300, "temperature": 0, "prompt": COUNTING}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=httpx.Timeout(5, read=1))
    deadline = time.monotonic() + 60  # it generates for ~10 s if nothing cancels it
    while server.metric("semantic_requests_abandoned_total") == abandoned:
        assert time.monotonic() < deadline, "the request was never cancelled"
        httpx.get(f"{server.url}/health")
    assert server.metric("semantic_requests_total") == finished
    # An agent's turn the client never saw is not in its transcript (a retry would double it).
    httpx.post(f"{server.url}/v1/agents", json={"id": "impatient"}).raise_for_status()
    turn = {"content": COUNTING, "max_tokens": 300}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{server.url}/v1/agents/impatient/messages",
            json=turn,
            timeout=httpx.Timeout(5, read=1),
        )
    while server.metric("semantic_requests_abandoned_total") == abandoned + 1:
        assert time.monotonic() < deadline + 60, "the turn was never cancelled"
        httpx.get(f"{server.url}/health")
    transcript = httpx.get(f"{server.url}/v1/agents/impatient/messages").json()
    assert transcript["data"] == []
    assert server.log.read_text().count("unexpected error") == unexpected, "a leaver is no bug"


COUNTING = "Numbers: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,"


def test_an_agent_that_cannot_fit_the_context_is_told_so_by_field(server: ServerProcess) -> None:
    agents = f"{server.url}/v1/agents"
    huge = httpx.post(agents, json={"id": "verbose", "system_prompt": "word " * 9000})
    assert (huge.status_code, huge.json()["error"]["param"]) == (400, "system_prompt")
    roomy = httpx.post(agents, json={"id": "roomy", "system_prompt": "word " * 7000})
    assert roomy.status_code == 201
    outgrown = httpx.post(f"{agents}/roomy/messages", json={"content": "more " * 1500})
    assert outgrown.status_code == 400
    assert outgrown.json()["error"]["param"] == "content"
    assert "'roomy' has outgrown" in outgrown.json()["error"]["message"]
    greedy = httpx.post(f"{agents}/roomy/messages", json={"content": "hi", "max_tokens": 4000})
    assert (greedy.status_code, greedy.json()["error"]["param"]) == (400, "max_tokens")
    assert "ask for fewer max_tokens" in greedy.json()["error"]["message"]
    both = httpx.post(
        agents, json={"id": "elsewhere", "namespace": "team-c"}, headers={"X-Namespace": "team-a"}
    )
    assert (both.status_code, both.json()["error"]["param"]) == (400, "namespace")
    httpx.post(agents, json={"id": "brief"}).raise_for_status()
    turn = {"content": "Count: 1, 2, 3, 4,", "max_tokens": 12, "stop": "6", "temperature": 0}
    answered = httpx.post(f"{agents}/brief/messages", json=turn, timeout=60)
    assert answered.status_code == 200, "a stop string alone, as the other routes take it"


def test_a_plain_request_may_not_take_over_an_agent_that_keeps_its_transcript(
    server: ServerProcess,
) -> None:
    """Its KV would replace the transcript's, to be computed again after a restart. Refused
    from the agent's creation on (QA pass 13: before its first turn a plain request was
    served and left its own conversation as the agent's cache)."""
    agents = f"{server.url}/v1/agents"
    httpx.post(agents, json={"id": "keeper", "system_prompt": "You are a cat."}).raise_for_status()
    chat = {"model": "default", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}
    header = {"X-Agent-Id": "keeper"}
    before_any_turn = httpx.post(f"{server.url}/v1/chat/completions", json=chat, headers=header)
    assert before_any_turn.status_code == 409
    assert httpx.get(f"{agents}/keeper/cache").json()["tokens"] == 0, "nothing of it kept"
    turn = httpx.post(f"{agents}/keeper/messages", json={"content": "Hi", "max_tokens": 1})
    turn.raise_for_status()
    for path in ("/v1/chat/completions", "/v1/messages"):
        refused = httpx.post(f"{server.url}{path}", json=chat, headers=header)
        assert refused.status_code == 409, path
        assert "/v1/agents/keeper/messages" in refused.text, path
    httpx.post(f"{agents}/keeper/fork", json={"id": "keeper-2"}).raise_for_status()
    forked = httpx.post(
        f"{server.url}/v1/chat/completions", json=chat, headers={"X-Agent-Id": "keeper-2"}
    )
    assert forked.status_code == 409, "a fork keeps its transcript too"


def test_the_weights_move_onto_huge_pages_once_the_server_answers(server: ServerProcess) -> None:
    def said() -> str:
        found = httpx.get(f"{server.url}/v1/models/default", timeout=10).json()
        return str(found["runtime"]["accelerations"]["weights on huge pages (ADR 0032)"])

    deadline = time.monotonic() + 300  # the move runs at the lowest priority (last here: the
    # other tests of the module leave it their idle time)
    while said().startswith("on (") and time.monotonic() < deadline:
        time.sleep(0.2)
    if not huge_pages_expected():
        assert said().startswith("off: ")
        return
    assert said() == "on"
    assert server.process is not None
    with open(f"/proc/{server.process.pid}/smaps_rollup") as rollup:
        huge_kb = next(int(line.split()[1]) for line in rollup if line.startswith("AnonHuge"))
    assert huge_kb * 1024 > 500e6  # SmolLM2's 538 MB of float32 weights, bar a page or two
