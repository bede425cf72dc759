"""Memory that survives the process: restarts, crashes, stateful agents and forks."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from reliability.server import ServerProcess

from tests.e2e.sdk_types import openai_messages

pytestmark = pytest.mark.model

Start = Callable[..., ServerProcess]


def chat(server: ServerProcess, messages: list[dict[str, str]], **headers: str) -> Any:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", default_headers=headers)
    return client.chat.completions.create(
        model="default",
        messages=openai_messages(messages),
        temperature=0,
        max_tokens=16,
    )


def test_conversations_continue_from_disk_after_a_kill(new_server: Start) -> None:
    """One server life for two cases (a model load is the slow part): an agent, and two
    conversations without one that share a system prompt longer than two blocks (QA pass 9:
    such conversations were one record, and all but the last saved lost their KV)."""
    first_server = new_server()
    history = [{"role": "user", "content": "Name three colours."}]
    first = chat(first_server, history, **{"X-Agent-Id": "painter"})
    history += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Which one is the warmest?"},
    ]
    rules = " ".join(f"Rule {i}: answer briefly." for i in range(90))
    anonymous = [
        [{"role": "system", "content": rules}, {"role": "user", "content": question}]
        for question in ("Name a fruit.", "Name a river.")
    ]
    sent = [chat(first_server, talk).usage.prompt_tokens for talk in anonymous]
    assert min(sent) > 512
    first_server.kill()
    second_server = new_server(data_dir=first_server.data_dir)
    warm = chat(second_server, history, **{"X-Agent-Id": "painter"})
    cold = chat(second_server, history, **{"X-Namespace": "elsewhere"})
    assert warm.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert warm.choices[0].message.content == cold.choices[0].message.content
    assert second_server.metric("semantic_restored_tokens_total", {"tier": "disk"}) > 0
    for talk, tokens in zip(anonymous, sent, strict=True):
        assert chat(second_server, talk).usage.prompt_tokens_details.cached_tokens == tokens - 1


def test_agents_returning_together_beyond_memory_all_restore_their_prefixes(
    new_server: Start,
) -> None:
    """64 MB holds ~1,450 tokens of KV: three ~400-token agents' restored prefixes plus the
    copy the first one admitted makes do not fit at once. Prefixes let go to make room are
    read again at each request's turn instead of being computed."""
    text = " ".join(f"item{i} is a thing that matters," for i in range(40))
    first_server = new_server("--kv-budget-mb", "64")
    histories, first_prompts = {}, {}
    for agent in ("a0", "a1", "a2"):
        history = [{"role": "user", "content": f"Agent {agent}. {text} Summarise."}]
        reply = chat(first_server, history, **{"X-Agent-Id": agent})
        first_prompts[agent] = reply.usage.prompt_tokens
        history += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": "More?"},
        ]
        histories[agent] = history
    # An agent past half the pool: its prefix and the copy of it cannot both be held.
    agents = f"{first_server.url}/v1/agents"
    long_prompt = " ".join(f"item{i} is a thing that matters," for i in range(90))
    httpx.post(agents, json={"id": "big", "system_prompt": long_prompt}).raise_for_status()
    turns = [
        httpx.post(f"{agents}/big/messages", json={"content": q, "max_tokens": 2}, timeout=60)
        for q in ("Summarise.", "Again?")
    ]
    first, second = (t.json()["usage"] for t in turns)
    assert first["prompt_tokens"] > 0.5 * 64 * 2**20 / 46080  # over half the pool's tokens
    assert second["cached_tokens"] >= first["prompt_tokens"]
    assert first_server.stop() == 0
    second_server = new_server("--kv-budget-mb", "64", data_dir=first_server.data_dir)

    def returning(agent: str) -> Any:
        return chat(second_server, histories[agent], **{"X-Agent-Id": agent})

    with ThreadPoolExecutor(3) as pool:
        replies = dict(zip(histories, pool.map(returning, histories), strict=True))
    for agent, reply in replies.items():
        assert reply.usage.prompt_tokens_details.cached_tokens >= first_prompts[agent], agent


def test_of_deletes_that_race_only_the_first_finds_the_agent(server: ServerProcess) -> None:
    api = f"{server.url}/v1/agents"
    httpx.post(api, json={"id": "raced"}).raise_for_status()
    with ThreadPoolExecutor(8) as pool:
        codes = sorted(pool.map(lambda _: httpx.delete(f"{api}/raced").status_code, range(8)))
    assert codes == [204] + [404] * 7


def test_deleting_an_agent_ends_its_running_turn_which_keeps_nothing(
    server: ServerProcess,
) -> None:
    api = f"{server.url}/v1/agents"
    httpx.post(api, json={"id": "doomed"}).raise_for_status()
    long_turn = {"content": "Count from 1 to 1000.", "max_tokens": 2000, "stream": True}
    events, last_data = [], ""
    with httpx.stream("POST", f"{api}/doomed/messages", json=long_turn, timeout=120) as stream:
        for line in stream.iter_lines():
            last_data = line if line.startswith("data: ") else last_data
            if not line.startswith("event: "):
                continue
            events.append(line.removeprefix("event: "))
            if events == ["delta"]:  # the turn runs: delete the agent under it, racing
                with ThreadPoolExecutor(4) as pool:
                    deletes = pool.map(lambda _: httpx.delete(f"{api}/doomed", timeout=120), "1234")
                    codes = sorted(reply.status_code for reply in deletes)
                assert codes == [204, 404, 404, 404], "only the first delete finds it"
    assert events[-1] == "error"  # not a committed message
    error = json.loads(last_data.removeprefix("data: "))["error"]
    assert (error["type"], error["code"]) == ("not_found_error", "not_found")  # as a 404's
    assert len(events) < 2000
    assert httpx.get(f"{api}/doomed").status_code == 404
    httpx.post(api, json={"id": "doomed"}).raise_for_status()  # the id is free, and clean
    assert httpx.get(f"{api}/doomed/messages").json()["data"] == []


@pytest.mark.parametrize("first_turn", [True, False], ids=["first-turn", "later-turn"])
def test_deleting_an_agent_ends_its_running_plain_request_which_keeps_nothing(
    server: ServerProcess, first_turn: bool
) -> None:
    """QA pass 10: a plain request naming the agent ran on after the delete and brought the
    agent back (or, on its first turn, the delete was a 404 and the turn created it)."""
    agent, namespace = "plain-doomed", f"plain-deletes-{first_turn}"
    who = {"X-Agent-Id": agent, "X-Namespace": namespace}
    if not first_turn:
        chat(server, [{"role": "user", "content": "Hello there."}], **who)
    messages = [{"role": "user", "content": "Count from 1 to 1000."}]
    body = {"model": "default", "messages": messages, "max_tokens": 2000, "stream": True}
    url, lines = f"{server.url}/v1/chat/completions", []
    with httpx.stream("POST", url, json=body, headers=who, timeout=120) as stream:
        for line in stream.iter_lines():
            lines.append(line)
            if len(lines) == 3:  # tokens flow: delete the agent under the request
                deleted = httpx.delete(f"{server.url}/v1/agents/{agent}", headers=who, timeout=60)
                assert deleted.status_code == 204
    errors = [line for line in lines if '"error"' in line]
    assert errors, "the stream ends with an error event"
    assert '"code": "not_found"' in errors[0], "typed as a 404 would be (QA pass 12)"
    assert len(lines) < 2000
    assert httpx.get(f"{server.url}/v1/agents/{agent}", headers=who).status_code == 404
    probe = chat(server, messages, **{"X-Namespace": namespace})
    assert probe.usage.prompt_tokens_details.cached_tokens < probe.usage.prompt_tokens - 8


def test_deleting_an_agent_deletes_the_branches_it_left(server: ServerProcess) -> None:
    """An agent that changed its history keeps the old branch's KV, found by prompt (unit
    tests show it); once the agent is deleted, nothing of either branch is found."""
    who = {"X-Agent-Id": "brancher", "X-Namespace": "branches"}
    talks = [
        [{"role": "user", "content": "Tell me about owls and their habits at night."}],
        [{"role": "user", "content": "Tell me about bees and their habits by day."}],
    ]
    sent = [chat(server, talk, **who).usage.prompt_tokens for talk in talks]
    anonymous = {"X-Namespace": "branches"}
    assert httpx.delete(f"{server.url}/v1/agents/brancher", headers=anonymous).status_code == 204
    for talk, tokens in zip(talks, sent, strict=True):
        again = chat(server, [*talk, {"role": "user", "content": "Go on."}], **anonymous)
        assert again.usage.prompt_tokens_details.cached_tokens < tokens - 8  # the template's
        # own system prompt, which the first of these saved, is all that can be found


def test_stateful_agents_keep_transcripts_across_a_restart_and_fork_cheaply(
    new_server: Start,
) -> None:
    server = new_server()
    api = f"{server.url}/v1/agents"
    assert (
        httpx.post(api, json={"id": "tutor", "system_prompt": "You teach geography."}).status_code
        == 201
    )
    assert httpx.post(api, json={"id": "tutor"}).status_code == 409
    hints = {"retention": {"pinned": True, "ttl_seconds": 900, "priority": 70}}
    assert httpx.patch(f"{api}/tutor", json=hints).status_code == 200
    for question in ("What is the capital of France?", "And of Spain?"):
        reply = httpx.post(
            f"{api}/tutor/messages", json={"content": question, "max_tokens": 16}, timeout=120
        )
        assert reply.status_code == 200, reply.text
    assert server.stop() == 0
    server = new_server(data_dir=server.data_dir)
    api = f"{server.url}/v1/agents"
    kept = httpx.get(f"{api}/tutor").json()
    assert kept["retention"] == {  # the hints and the TTL's deadline outlive the process
        **hints["retention"],
        "ttl_ends_at": kept["last_used"] + 900,
    }
    transcript = httpx.get(f"{api}/tutor/messages").json()["data"]
    assert [m["role"] for m in transcript] == ["user", "assistant", "user", "assistant"]
    third = httpx.post(
        f"{api}/tutor/messages", json={"content": "And of Italy?", "max_tokens": 16}, timeout=120
    ).json()
    assert third["usage"]["cached_tokens"] > 0
    assert third["id"] == "msg_6"  # the reply's place in the transcript, to page on from
    paged = httpx.get(f"{api}/tutor/messages", params={"after": "msg_5"}).json()["data"]
    assert [(m["id"], m["content"]) for m in paged] == [("msg_6", third["content"])]
    fork = httpx.post(f"{api}/tutor/fork", json={"id": "tutor-2"})
    assert fork.status_code == 201
    assert fork.json()["retention"]["pinned"]  # a fork keeps its source's hints
    assert fork.json()["cache"]["blocks"] == httpx.get(f"{api}/tutor").json()["cache"]["blocks"]
    forked = httpx.post(
        f"{api}/tutor-2/messages",
        json={"content": "And of Germany?", "max_tokens": 16},
        timeout=120,
    ).json()
    assert forked["usage"]["cached_tokens"] >= third["usage"]["prompt_tokens"]
    assert len(httpx.get(f"{api}/tutor-2/messages").json()["data"]) == 8
    assert httpx.delete(f"{api}/tutor-2").status_code == 204
    assert httpx.get(f"{api}/tutor-2").status_code == 404
    assert len(httpx.get(f"{api}/tutor/messages").json()["data"]) == 6


def test_an_api_key_guards_every_route_but_health(new_server: Start) -> None:
    page = "http://localhost:3000"
    server = new_server("--api-key", "s3cret", "--cors-origin", page)
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert httpx.get(f"{server.url}/v1/models").status_code == 401
    assert httpx.get(f"{server.url}/v1/models", headers={"x-api-key": "wrong"}).status_code == 401
    assert (
        httpx.get(f"{server.url}/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code
        == 200
    )
    assert httpx.get(f"{server.url}/metrics", headers={"x-api-key": "s3cret"}).status_code == 200
    # A browser page from an origin let in: its preflight carries no key, its request does.
    asks = {"Origin": page, "Access-Control-Request-Method": "POST"}
    asks["Access-Control-Request-Headers"] = "authorization, content-type, x-agent-id"
    preflight = httpx.options(f"{server.url}/v1/chat/completions", headers=asks)
    assert preflight.status_code in (200, 204), preflight.text
    assert preflight.headers["access-control-allow-origin"] == page
    keyed = {"Origin": page, "x-api-key": "s3cret"}
    assert (
        httpx.get(f"{server.url}/v1/models", headers=keyed).headers["access-control-allow-origin"]
        == page
    )
    wrong_key = httpx.get(f"{server.url}/v1/models", headers={**keyed, "x-api-key": "wrong"})
    assert wrong_key.status_code == 401  # and the page may read so
    assert wrong_key.headers["access-control-allow-origin"] == page
    elsewhere = {"Origin": "http://evil.example", "x-api-key": "s3cret"}
    assert (
        "access-control-allow-origin"
        not in httpx.get(f"{server.url}/v1/models", headers=elsewhere).headers
    )
    refused_elsewhere = httpx.get(
        f"{server.url}/v1/models", headers={"Origin": "http://evil.example"}
    )
    assert "access-control-allow-origin" not in refused_elsewhere.headers


def test_a_stream_that_outlives_the_grace_ends_with_an_error_not_a_cut(new_server: Start) -> None:
    server = new_server("--grace", "1")
    body = {
        "model": "default",
        "stream": True,
        "max_tokens": 2000,  # ~40 s of counting: far past the grace
        "temperature": 0,
        "prompt": "Numbers: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,",
    }
    lines: list[str] = []
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            lines.append(line)
            if len(lines) == 5:  # streaming: now ask the server to stop
                assert server.process is not None
                server.process.send_signal(signal.SIGTERM)
    events = [line for line in lines if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert "the server shut down before this request finished" in events[-2]
    assert server.process is not None
    assert server.process.wait(30) == 0


def test_agents_and_transcripts_are_listed_in_pages(server: ServerProcess) -> None:
    api, tenant = f"{server.url}/v1/agents", {"X-Namespace": "paging"}
    for name in ("pa", "pb", "pc", "pd", "pe"):
        httpx.post(api, json={"id": name}, headers=tenant).raise_for_status()
    seen, after, pages = [], None, 0
    while True:
        query = {"limit": 2} | ({"after": after} if after else {})
        page = httpx.get(api, params=query, headers=tenant).json()
        seen += [agent["id"] for agent in page["data"]]
        pages, after = pages + 1, seen[-1]
        if not page["has_more"]:
            break
    assert (seen, pages) == (["pa", "pb", "pc", "pd", "pe"], 3)
    for question in ("One?", "Two?"):
        turn = {"content": question, "max_tokens": 1}
        httpx.post(f"{api}/pa/messages", json=turn, headers=tenant, timeout=60).raise_for_status()
    first = httpx.get(f"{api}/pa/messages", params={"limit": 3}, headers=tenant).json()
    assert [m["id"] for m in first["data"]] == ["msg_1", "msg_2", "msg_3"]
    assert first["has_more"]
    rest = httpx.get(f"{api}/pa/messages", params={"after": "msg_3"}, headers=tenant).json()
    assert ([m["id"] for m in rest["data"]], rest["has_more"]) == (["msg_4"], False)
    for params, field in (({"limit": 0}, "limit"), ({"after": "pa"}, "after")):
        refused = httpx.get(f"{api}/pa/messages", params=params, headers=tenant)
        assert (refused.status_code, refused.json()["error"]["param"]) == (400, field)
    not_an_id = httpx.get(api, params={"after": ".."}, headers=tenant)
    assert (not_an_id.status_code, not_an_id.json()["error"]["param"]) == (400, "after")
    not_a_number = httpx.get(f"{api}/pa/messages", params={"limit": "ten"}, headers=tenant)
    assert "invalid query parameter" in not_a_number.json()["error"]["message"]
