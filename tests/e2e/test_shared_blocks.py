"""Two real servers, each with its own data directory, sharing one PostgreSQL database (the
metadata) and one real Redis as their block tier (``--shared-blocks``, and
``$SEMANTIC_SHARED_BLOCKS``): an agent that talked on one continues on the other with its
prefix restored from Redis; Redis down at start or while serving costs hits, never answers,
and ``/health`` and the metrics say so."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import openai
import pytest
from reliability.server import ServerProcess
from reliability.services.postgres import PostgresServer
from reliability.services.redis import RedisServer

from tests.e2e.sdk_types import openai_messages
from tests.e2e.test_cli import semantic

pytestmark = pytest.mark.model

RULES = " ".join(f"Rule {i}: keep the harbour log in order." for i in range(50))


def chat(server: ServerProcess, messages: list[dict[str, str]], **headers: str) -> Any:
    client = openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="unused", default_headers=headers, max_retries=0
    )
    return client.chat.completions.create(
        model="default", messages=openai_messages(messages), temperature=0, max_tokens=12
    )


def shared_state(server: ServerProcess) -> str:
    reply = httpx.get(f"{server.url}/health", timeout=10)
    assert reply.status_code == 200
    return str(reply.json()["shared_blocks"])


def eventually(condition: Callable[[], bool], what: str, within_s: float = 20.0) -> None:
    """Waits for a condition another process brings about (a push, a reconnection)."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within_s} s: {what}")
        time.sleep(0.1)


@pytest.fixture
def pair(
    tmp_path: Path, postgres: PostgresServer
) -> Iterator[tuple[ServerProcess, ServerProcess, RedisServer]]:
    """Two servers on one database, pointed at a Redis that is not started yet."""
    redis = RedisServer(tmp_path / "redis")
    database = postgres.create_database(f"shared_{uuid4().hex[:12]}")
    quotas = tmp_path / "quotas.json"
    quotas.write_text(json.dumps({"capped": {"shared_mb": 12}}))  # one block of this model
    one = ServerProcess(
        tmp_path / "one",
        "--database-url",
        database,
        "--shared-blocks",
        redis.url,
        "--namespace-quotas",
        str(quotas),
    )
    two = ServerProcess(
        tmp_path / "two",
        "--database-url",
        database,
        env={"SEMANTIC_SHARED_BLOCKS": redis.url},
    )
    try:
        with ThreadPoolExecutor(2) as starting:
            list(starting.map(lambda server: server.start(), (one, two)))
        yield one, two, redis
    finally:
        one.kill()
        two.kill()
        redis.stop()


def test_an_agent_continues_on_another_server_from_redis_and_serves_without_it(
    pair: tuple[ServerProcess, ServerProcess, RedisServer],
) -> None:
    one, two, redis = pair
    assert shared_state(one) == shared_state(two) == "unreachable"  # down at start
    assert chat(one, [{"role": "user", "content": "Say hi."}]).choices[0].message.content
    assert one.metric("semantic_shared_blocks_reachable") == 0

    redis.start()
    eventually(lambda: shared_state(one) == shared_state(two) == "ok", "both see Redis")
    agent = {"X-Agent-Id": "navigator"}
    talk = [{"role": "system", "content": RULES}, {"role": "user", "content": "Name a ship."}]
    first = chat(one, talk, **agent)
    talk += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And its captain?"},
    ]
    second = chat(one, talk, **agent)
    assert second.usage.prompt_tokens > 512
    published = {"event": "published"}
    eventually(lambda: one.metric("semantic_shared_blocks_total", published) >= 4, "pushed")

    talk += [
        {"role": "assistant", "content": second.choices[0].message.content},
        {"role": "user", "content": "Where is it moored?"},
    ]
    moved = chat(two, talk, **agent)  # its rows in PostgreSQL, its files only in Redis
    cold = chat(two, talk, **{"X-Namespace": "elsewhere"})
    assert moved.usage.prompt_tokens_details.cached_tokens >= 0.9 * second.usage.prompt_tokens
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert moved.choices[0].message.content == cold.choices[0].message.content
    assert two.metric("semantic_shared_blocks_total", {"event": "fetched"}) >= 2
    assert two.metric("semantic_corrupt_blocks_total") == 0
    capped_in_redis(one)

    redis.stop()  # while serving
    talk += [
        {"role": "assistant", "content": moved.choices[0].message.content},
        {"role": "user", "content": "Thanks."},
    ]
    assert chat(two, talk, **agent).usage.prompt_tokens_details.cached_tokens > 512  # own disk
    other = [{"role": "system", "content": RULES}, {"role": "user", "content": "Name a port."}]
    assert chat(one, other).choices[0].message.content
    eventually(lambda: "unreachable" in (shared_state(one), shared_state(two)), "the outage")
    assert min(s.metric("semantic_shared_blocks_reachable") for s in (one, two)) == 0
    back_empty(one, two, redis)


def shared_usage(server: ServerProcess, namespace: str) -> dict[str, Any]:
    reply = httpx.get(f"{server.url}/v1/namespaces/{namespace}/usage", timeout=10)
    assert reply.status_code == 200
    return dict(reply.json()["shared"])


def capped_in_redis(one: ServerProcess) -> None:
    """A namespace with a shared-tier quota of one block pushes a longer prompt's blocks:
    its own least recently used go, within its quota; the other namespace's stay."""
    before = shared_usage(one, "default")["used_bytes"]
    assert before > 0
    chat(
        one,
        [{"role": "system", "content": RULES}, {"role": "user", "content": "A tide?"}],
        **{"X-Namespace": "capped"},
    )
    trimmed = {"event": "trimmed"}
    eventually(lambda: one.metric("semantic_shared_blocks_total", trimmed) >= 1, "trimmed")
    capped = shared_usage(one, "capped")
    assert 0 < capped["used_bytes"] <= capped["quota_bytes"] == 12 << 20
    assert shared_usage(one, "default")["used_bytes"] == before


def back_empty(one: ServerProcess, two: ServerProcess, redis: RedisServer) -> None:
    """Redis restarted empty (it keeps nothing on disk) after an agent's blocks went there:
    its next turn, on the instance that never had them, recomputes them: the same answer
    as a cold one, no error, nothing counted corrupt."""
    redis.start()
    eventually(lambda: shared_state(one) == shared_state(two) == "ok", "both see Redis again")
    agent = {"X-Agent-Id": "skipper"}
    talk = [
        {"role": "system", "content": "Reefs. " + RULES},
        {"role": "user", "content": "Name a reef."},
    ]
    # counted before the turn: its blocks may be pushed before its reply is read
    published = one.metric("semantic_shared_blocks_total", {"event": "published"})
    first = chat(one, talk, **agent)
    eventually(
        lambda: one.metric("semantic_shared_blocks_total", {"event": "published"}) > published,
        "pushed again",
    )
    redis.stop()
    redis.start()  # empty
    eventually(lambda: shared_state(one) == shared_state(two) == "ok", "Redis back, empty")
    talk += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "How deep is it?"},
    ]
    missed = two.metric("semantic_shared_blocks_total", {"event": "missed"})
    moved = chat(two, talk, **agent)
    cold = chat(two, talk, **{"X-Namespace": "after-the-flush"})
    assert moved.choices[0].message.content == cold.choices[0].message.content
    assert two.metric("semantic_shared_blocks_total", {"event": "missed"}) > missed  # looked
    assert two.metric("semantic_corrupt_blocks_total") == 0
    frozen(one, two, redis)


def frozen(one: ServerProcess, two: ServerProcess, redis: RedisServer) -> None:
    """Redis stopped dead (SIGSTOP: connections open, nothing answers), as a slow network
    or a stalled host looks: a turn whose blocks are only there recomputes after the read's
    timeout, a turn whose blocks go there is answered while the push waits off the request
    path, and both instances stay ready (the tier is a cache)."""
    agent = {"X-Agent-Id": "diver"}
    talk = [
        {"role": "system", "content": "Dives. " + RULES},
        {"role": "user", "content": "A wreck?"},
    ]
    published = {"event": "published"}
    # counted before the turn: its blocks may be pushed before its reply is read
    before = one.metric("semantic_shared_blocks_total", published)
    first = chat(one, talk, **agent)
    eventually(lambda: one.metric("semantic_shared_blocks_total", published) > before, "pushed")
    redis.signal(signal.SIGSTOP)
    try:
        talk += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "How old is it?"},
        ]
        moved = chat(two, talk, **agent)
        cold = chat(two, talk, **{"X-Namespace": "while-frozen"})
        assert moved.choices[0].message.content == cold.choices[0].message.content
        fresh = [
            {"role": "system", "content": "Swims. " + RULES},
            {"role": "user", "content": "A bay?"},
        ]
        assert chat(one, fresh, **{"X-Agent-Id": "swimmer"}).choices[0].message.content
        for server in (one, two):
            assert httpx.get(f"{server.url}/ready", timeout=10).status_code == 200
    finally:
        redis.signal(signal.SIGCONT)


@pytest.mark.parametrize("where", ["flag", "environment"])
def test_a_shared_blocks_url_that_is_not_redis_is_refused_without_its_password(
    tmp_path: Path, where: str
) -> None:
    url = "http://user:s3cret@example.invalid:6379/0"
    given = ["--shared-blocks", url] if where == "flag" else []
    env = {"SEMANTIC_SHARED_BLOCKS": url} if where == "environment" else {}
    result = semantic("serve", "--data-dir", str(tmp_path), *given, env=env, timeout=60)
    assert result.returncode == 2
    assert "must be a redis://, rediss:// or unix:// URL, not a http:// URL" in result.stderr
    assert "s3cret" not in result.stderr
    assert "Traceback" not in result.stderr
