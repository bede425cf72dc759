"""Two real servers, each with its own data directory, sharing one real Redis as their
block tier (``--shared-blocks``, and ``$SEMANTIC_SHARED_BLOCKS``): what one computed, the
other restores from Redis; Redis down at start or while serving costs hits, never answers,
and ``/health`` and the metrics say so."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from reliability.server import ServerProcess
from reliability.services.redis import RedisServer

from tests.e2e.sdk_types import openai_messages

pytestmark = pytest.mark.model

RULES = " ".join(f"Rule {i}: keep the harbour log in order." for i in range(80))


def chat(server: ServerProcess, messages: list[dict[str, str]]) -> Any:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
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
def pair(tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess, RedisServer]]:
    """Two servers pointed at a Redis that is not started yet."""
    redis = RedisServer(tmp_path / "redis")
    one = ServerProcess(tmp_path / "one", "--shared-blocks", redis.url)
    two = ServerProcess(tmp_path / "two", env={"SEMANTIC_SHARED_BLOCKS": redis.url})
    try:
        with ThreadPoolExecutor(2) as starting:
            list(starting.map(lambda server: server.start(), (one, two)))
        yield one, two, redis
    finally:
        one.kill()
        two.kill()
        redis.stop()


def test_two_servers_share_blocks_through_redis_and_serve_without_it(
    pair: tuple[ServerProcess, ServerProcess, RedisServer],
) -> None:
    one, two, redis = pair
    assert shared_state(one) == shared_state(two) == "unreachable"  # down at start
    assert chat(one, [{"role": "user", "content": "Say hi."}]).choices[0].message.content
    assert one.metric("semantic_shared_blocks_reachable") == 0

    redis.start()
    eventually(lambda: shared_state(one) == shared_state(two) == "ok", "both see Redis")
    talk = [{"role": "system", "content": RULES}, {"role": "user", "content": "Name a ship."}]
    first = chat(one, talk)
    assert first.usage.prompt_tokens > 512
    published = {"event": "published"}
    eventually(lambda: one.metric("semantic_shared_blocks_total", published) >= 3, "pushed")

    again = chat(two, talk)  # an empty data directory: only Redis has the prefix
    assert again.usage.prompt_tokens_details.cached_tokens >= 512
    assert again.choices[0].message.content == first.choices[0].message.content
    assert two.metric("semantic_shared_blocks_total", {"event": "fetched"}) >= 2
    assert two.metric("semantic_restored_tokens_total", {"tier": "disk"}) >= 512

    redis.stop()  # while serving
    other = [{"role": "system", "content": RULES}, {"role": "user", "content": "Name a port."}]
    assert chat(two, other).choices[0].message.content
    assert chat(one, [{"role": "user", "content": "And a river?"}]).choices[0].message.content
    eventually(lambda: shared_state(two) == "unreachable", "the outage is reported")
    assert two.metric("semantic_shared_blocks_reachable") == 0
