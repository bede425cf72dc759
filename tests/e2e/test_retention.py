"""Retention hints on a real server (issue 46, item 1): as the official SDKs send them,
on the agents API, and a TTL that ends by moving an agent's KV to disk, from where its next
turn restores, answering as a cold start would. Bad hints are refused by name and change
nothing."""

from __future__ import annotations

import time
from typing import Any

import anthropic
import httpx
import openai
import pytest
from reliability.server import ServerProcess

pytestmark = pytest.mark.model

NOTES = " ".join(f"Note {i}: the ferry leaves at {i} past the hour." for i in range(30))


def retention_of(server: ServerProcess, agent: str, **headers: str) -> dict[str, Any]:
    found = httpx.get(f"{server.url}/v1/agents/{agent}", headers=headers)
    assert found.status_code == 200, found.text
    kept: dict[str, Any] = found.json()["retention"]
    return kept


def test_the_sdks_cache_fields_set_the_agents_retention(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Say hi."}],
        max_tokens=1,
        prompt_cache_key="ferry-desk",
        prompt_cache_retention="in_memory",
    )
    assert retention_of(server, "ferry-desk")["ttl_seconds"] == 600
    named = client.with_options(default_headers={"X-Agent-Id": "ferry-night"})
    named.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Say hi."}],
        max_tokens=1,
        prompt_cache_retention="24h",
    )
    assert retention_of(server, "ferry-night")["ttl_seconds"] == 86_400
    answered = client.responses.create(
        model="default", input="Say hi.", max_output_tokens=16, prompt_cache_retention="24h"
    )
    assert answered.status in ("completed", "incomplete")  # 16 tokens may cut it short

    claude = anthropic.Anthropic(
        base_url=server.url, api_key="unused", default_headers={"X-Agent-Id": "ferry-claude"}
    )
    claude.messages.create(
        model="default",
        max_tokens=1,
        system=[
            {
                "type": "text",
                "text": "You sell ferry tickets.",
                "cache_control": {"type": "ephemeral", "ttl": "1h"},
            }
        ],
        messages=[{"role": "user", "content": "One ticket."}],
    )
    kept = retention_of(server, "ferry-claude")
    assert kept["ttl_seconds"] == 3600
    assert kept["ttl_ends_at"] > time.time() + 3000


def test_the_agents_api_sets_and_changes_hints_and_refuses_bad_ones(
    server: ServerProcess,
) -> None:
    api = f"{server.url}/v1/agents"
    made = httpx.post(
        api, json={"id": "retention-keeper", "retention": {"priority": 80, "pinned": True}}
    )
    assert made.status_code == 201, made.text
    assert made.json()["retention"] == {
        "priority": 80,
        "ttl_seconds": None,
        "pinned": True,
        "ttl_ends_at": None,
    }
    patched = httpx.patch(f"{api}/retention-keeper", json={"retention": {"ttl_seconds": 120}})
    assert patched.status_code == 200, patched.text
    assert patched.json()["retention"]["ttl_seconds"] == 120
    assert patched.json()["retention"]["priority"] == 80  # not given: kept
    by_header = httpx.post(  # the header names the hints on any route, creation too
        api,
        json={"id": "retention-by-header", "retention": {"priority": 10}},
        headers={"X-Retention": "priority=90, ttl=300"},
    )
    assert by_header.status_code == 201, by_header.text
    assert by_header.json()["retention"]["priority"] == 90  # the header's over the body's
    assert by_header.json()["retention"]["ttl_seconds"] == 300

    refused: list[tuple[str, dict[str, Any], str]] = [
        ("post", {"id": "retention-bad-1", "retention": {"forever": True}}, "forever"),
        ("post", {"id": "retention-bad-2", "retention": {"priority": 101}}, "priority"),
        ("post", {"id": "retention-bad-3", "retention": {"ttl_seconds": -5}}, "ttl_seconds"),
        ("patch", {"retention": {"ttl_seconds": 1e12}}, "ttl_seconds"),
        ("patch", {"retention": {"priority": "high"}}, "priority"),
        ("patch", {"retention": {"priority": "50"}}, "retention.priority"),  # not converted
        ("patch", {"retention": {"pinned": 1}}, "retention.pinned"),
        ("post", {"id": "retention-bad-5", "retention": {"pinned": "true"}}, "pinned"),
    ]
    for method, body, field in refused:
        url = api if method == "post" else f"{api}/retention-keeper"
        answer = httpx.request(method, url, json=body)
        assert answer.status_code == 400, (body, answer.text)
        assert field in answer.text, answer.text
    assert httpx.get(f"{api}/retention-bad-1").status_code == 404  # nothing made
    assert httpx.get(f"{api}/retention-bad-5").status_code == 404
    assert retention_of(server, "retention-keeper")["priority"] == 80  # nothing changed
    assert retention_of(server, "retention-keeper")["pinned"] is True
    bad_made = httpx.post(
        api, json={"id": "retention-bad-4"}, headers={"X-Retention": "priority=500"}
    )
    assert bad_made.status_code == 400, bad_made.text
    assert bad_made.json()["error"]["param"] == "X-Retention"  # the header's, not the body's
    assert "priority" in bad_made.text
    twice = httpx.post(api, json={"id": "retention-bad-6"}, headers={"X-Retention": "ttl=5,ttl=9"})
    assert twice.status_code == 400
    assert "ttl is given twice" in twice.text
    ranged = httpx.post(api, json={"id": "retention-bad-7", "retention": {"priority": 101}})
    assert ranged.json()["error"]["param"] == "retention.priority"  # as the body names it
    assert httpx.get(f"{api}/retention-bad-4").status_code == 404
    turn = {"content": "Hi", "max_tokens": 1}
    bad_header = httpx.post(
        f"{api}/retention-keeper/messages",
        json=turn,
        headers={"X-Retention": "ttl=-3"},
        timeout=120,
    )
    assert bad_header.status_code == 400
    assert "ttl" in bad_header.text
    assert retention_of(server, "retention-keeper")["ttl_seconds"] == 120  # unchanged
    missing = httpx.patch(f"{api}/nobody-here", json={"retention": {"priority": 1}})
    assert missing.status_code == 404
    chat = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={
            "model": "default",
            "messages": [{"role": "user", "content": "x"}],
            "prompt_cache_retention": "forever",
        },
    )
    assert chat.status_code == 400
    assert "prompt_cache_retention" in chat.text
    too_long = httpx.post(
        f"{server.url}/v1/chat/completions",
        headers={"X-Agent-Id": "retention-never-kept", "X-Retention": "pinned"},
        json={"model": "default", "messages": [{"role": "user", "content": "word " * 20_000}]},
        timeout=120,
    )
    assert too_long.status_code == 400, too_long.text  # refused at the start:
    assert httpx.get(f"{api}/retention-never-kept").status_code == 404  # no hints were kept


def test_a_ttl_moves_the_kv_to_disk_and_the_next_turn_restores_it_as_cold(
    server: ServerProcess,
) -> None:
    api = f"{server.url}/v1/agents"
    system = "You answer questions about the ferry timetable."
    made = httpx.post(
        api,
        json={"id": "retention-brief", "system_prompt": system, "retention": {"ttl_seconds": 1}},
    )
    assert made.status_code == 201, made.text

    def turn(content: str) -> dict[str, Any]:
        sent = {"content": content, "max_tokens": 12, "temperature": 0}
        reply = httpx.post(f"{api}/retention-brief/messages", json=sent, timeout=120)
        assert reply.status_code == 200, reply.text
        body: dict[str, Any] = reply.json()
        return body

    first = turn(NOTES)
    deadline = time.monotonic() + 30  # the sweep runs twice a second: waited for, not timed
    cache = httpx.get(f"{api}/retention-brief/cache").json()
    while cache["hot_blocks"] and time.monotonic() < deadline:
        time.sleep(0.1)
        cache = httpx.get(f"{api}/retention-brief/cache").json()
    assert cache["hot_blocks"] == 0
    assert cache["disk_blocks"] == cache["blocks"] >= 2  # moved to disk, not deleted
    second = turn("When does the ferry leave?")
    assert second["usage"]["cached_tokens"] >= first["usage"]["prompt_tokens"]  # from disk

    cold = httpx.post(
        f"{server.url}/v1/chat/completions",
        headers={"X-Namespace": "cold-ferry"},  # nothing cached there
        json={
            "model": "default",
            "max_tokens": 12,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": NOTES},
                {"role": "assistant", "content": first["content"]},
                {"role": "user", "content": "When does the ferry leave?"},
            ],
        },
        timeout=120,
    ).json()
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["content"] == cold["choices"][0]["message"]["content"]
