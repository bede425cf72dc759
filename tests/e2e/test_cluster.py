"""A local cluster (``reliability.cluster``): one PostgreSQL, one Redis, three real
instances with leases, behind a real HAProxy with the shipped ``deploy/haproxy.cfg``. One
cluster for the module (each instance loads the model); the tests that kill or stop an
instance come last.

Routing: each agent lands on one instance, by header or path; agents spread; streams pass.
Issue 37's done-when: a SIGKILLed instance's agent resumes elsewhere from PostgreSQL and
Redis, equal to a cold answer; two instances asked for one agent at once run one turn at a
time; an instance stopped past its lease cannot commit; a short load loses nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI
from reliability.cluster import LocalCluster
from reliability.cluster_load import run_on
from reliability.server import ServerProcess
from sqlalchemy import NullPool, text
from sqlalchemy.ext.asyncio import create_async_engine

from tests.e2e.sdk_types import openai_messages

pytestmark = pytest.mark.model

BLOCK = 256
RULES = " ".join(f"Rule {i}: keep the harbour log in order." for i in range(40))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(Path(tmp_path_factory.mktemp("cluster"))) as started:
        yield started


@pytest.fixture
def shared(cluster: LocalCluster) -> LocalCluster:
    """The cluster, for tests of its shared PostgreSQL and Redis."""
    assert cluster.stores is not None
    return cluster


@pytest.fixture
def leased(shared: LocalCluster) -> LocalCluster:
    """The cluster, for tests of its leases."""
    assert shared.stores is not None
    if not shared.stores.leases:
        pytest.skip("needs --leases")
    return shared


def served_by(response: httpx.Response) -> str:
    """The instance HAProxy sent the request to (the name its config gives it)."""
    assert response.status_code < 500, response.text
    return response.headers["X-Semantic-Instance"]


def agent_client(url: str, agent: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"X-Agent-Id": agent}, timeout=120)


def send(api: httpx.Client, agent: str, content: str, **extra: Any) -> httpx.Response:
    """A turn, sent again after a 409 ``agent_busy``'s ``Retry-After``, as a client would."""
    for _ in range(10):
        reply = api.post(f"/v1/agents/{agent}/messages", json={"content": content, **extra})
        if reply.status_code != 409:
            return reply
        assert reply.json()["error"]["code"] == "agent_busy", reply.text
        time.sleep(float(reply.headers["Retry-After"]))
    raise AssertionError(f"{agent} stayed busy")


def transcript(url: str, agent: str) -> list[tuple[str, str]]:
    reply = httpx.get(f"{url}/v1/agents/{agent}/messages", timeout=30)
    assert reply.status_code == 200, reply.text
    return [(m["role"], m["content"]) for m in reply.json()["data"]]


def eventually(condition: Callable[[], bool], what: str, within_s: float = 30.0) -> None:
    """Waits for what another process brings about (a push to Redis, a lease let go)."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within_s} s: {what}")
        time.sleep(0.1)


def test_an_agent_lands_on_one_instance_by_its_header_or_its_path(cluster: LocalCluster) -> None:
    homes: dict[str, str] = {}
    for n in range(12):
        agent = f"routed-{n}"
        by_header = {
            served_by(httpx.get(f"{cluster.url}/v1/models", headers={"X-Agent-Id": agent}))
            for _ in range(3)
        }
        by_path = served_by(httpx.get(f"{cluster.url}/v1/agents/{agent}"))  # 404: no such agent
        assert by_header == {by_path}, agent
        homes[agent] = by_path
    assert set(homes.values()) == {"semantic1", "semantic2", "semantic3"}, homes


def test_requests_without_an_agent_go_to_any_instance(cluster: LocalCluster) -> None:
    seen = {served_by(httpx.get(f"{cluster.url}/v1/models")) for _ in range(9)}
    assert len(seen) >= 2, seen


def test_a_stream_passes_through_the_router(cluster: LocalCluster) -> None:
    client = OpenAI(
        base_url=f"{cluster.url}/v1", api_key="unused", default_headers={"X-Agent-Id": "streamer"}
    )
    stream = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Count from one to ten."}],
        max_tokens=24,
        temperature=0,
        stream=True,
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len([p for p in pieces if p]) > 1, pieces
    assert "".join(pieces).strip()


def test_a_short_load_through_the_router_loses_nothing(shared: LocalCluster) -> None:
    """6 agents x 3 turns at once (the full 24 x 6 is in ``python -m reliability``). Bounded
    load may send an agent's request to another instance than its home: only the shared
    stores and the leases keep that correct."""
    result = run_on(shared.url, agents=6, turns=3)
    assert result.server_errors == 0, result.failures
    assert result.transcripts_lost == 0, result.failures
    assert result.client_errors == 0, result.failures
    assert len(result.served_by) >= 2, result.served_by


def test_two_instances_asked_for_one_agent_at_once_take_turns(leased: LocalCluster) -> None:
    """Directly, not through the router: the second turn arrives while the first runs on
    another instance; it waits for the lease (or gets a 409), never runs beside it."""
    first, second = leased.servers[0], leased.servers[1]
    agent = "contended"
    assert agent_client(first.url, agent).post("/v1/agents", json={"id": agent}).status_code == 201
    running = threading.Event()
    replies: dict[str, httpx.Response] = {}

    def long_turn() -> None:
        body = {"content": "Count from one to fifty.", "max_tokens": 48, "stream": True}
        api = agent_client(first.url, agent)
        with api.stream("POST", f"/v1/agents/{agent}/messages", json=body) as stream:
            for _ in stream.iter_lines():
                running.set()  # the first event: its prefill is done, its lease held
            replies["first"] = stream

    runner = threading.Thread(target=long_turn)
    runner.start()
    assert running.wait(60)
    replies["second"] = agent_client(second.url, agent).post(
        f"/v1/agents/{agent}/messages", json={"content": "Name a colour.", "max_tokens": 8}
    )
    runner.join(120)
    assert replies["first"].status_code == 200
    assert replies["second"].status_code in (200, 409), replies["second"].text
    messages = transcript(first.url, agent)
    assert messages == transcript(second.url, agent)
    turns = 1 + (replies["second"].status_code == 200)
    assert [role for role, _ in messages] == ["user", "assistant"] * turns, messages
    assert messages[0][1] == "Count from one to fifty.", "the running turn first, then the other"
    if turns == 2:
        assert messages[3][1] == replies["second"].json()["content"]


@contextmanager
def stopped(server: ServerProcess, database_url: str) -> Iterator[None]:
    """SIGSTOP ``server`` outside any database transaction of its own (stopped inside one, it
    would hold its row locks), SIGCONT at the end."""
    assert server.process is not None
    pid = server.process.pid
    for _ in range(50):
        os.kill(pid, signal.SIGSTOP)
        if not asyncio.run(_in_transaction(database_url)):
            break
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.05)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


async def _in_transaction(database_url: str) -> bool:
    """Whether any session but this one is inside a transaction."""
    engine = create_async_engine(database_url, poolclass=NullPool)
    try:
        async with engine.connect() as connection:
            busy = await connection.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'"
                )
            )
        return bool(busy)
    finally:
        await engine.dispose()


def test_an_instance_stopped_past_its_lease_cannot_commit(leased: LocalCluster) -> None:
    """SIGSTOP an instance in the middle of a turn; another instance takes the agent once
    the lease expires and commits its turn; resumed, the stopped one's turn is refused by
    the epoch check, and the transcript holds only the other's."""
    paused, other = leased.servers[0], leased.servers[2]
    agent = "paused"
    assert agent_client(paused.url, agent).post("/v1/agents", json={"id": agent}).status_code == 201
    assert leased.stores is not None
    body = {"content": "Count from 1 to 1000.", "max_tokens": 150, "stream": True}
    events: list[str] = []
    last = ""
    api = agent_client(paused.url, agent)
    with api.stream("POST", f"/v1/agents/{agent}/messages", json=body) as stream:
        for line in stream.iter_lines():
            if line.startswith("event: "):
                events.append(line.removeprefix("event: "))
            last = line.removeprefix("data: ") if line.startswith("data: ") else last
            if events == ["delta"]:
                events.append("stopped")
                with stopped(paused, leased.stores.database_url):
                    took = send(agent_client(other.url, agent), agent, "Hi.", max_tokens=4)
                    assert took.status_code == 200, took.text
    assert events[-1] == "error", events
    assert "lost" in last, last
    messages = transcript(other.url, agent)
    assert messages == [("user", "Hi."), ("assistant", took.json()["content"])]


def test_a_killed_instance_s_agent_resumes_on_another_equal_to_cold(
    shared: LocalCluster,
) -> None:
    """Through the router: an agent's turns go to one instance; SIGKILL it; the next turn
    (sent at once: the refused connection is redispatched) lands on another instance, with
    the transcript intact, at least 90% of the previous prompt from Redis, and the same
    answer as a cold prefill of the same conversation. Last: the cluster stays one short."""
    agent = "survivor"
    api = agent_client(shared.url, agent)
    created = api.post("/v1/agents", json={"id": agent, "system_prompt": RULES})
    assert created.status_code == 201, created.text
    replies = [send(api, agent, q, max_tokens=16) for q in ("Name a ship.", "Name a port.")]
    home = {served_by(r) for r in [created, *replies]}
    assert len(home) == 1, home
    server = shared.servers[shared.index_of(home.pop())]
    published = {"event": "published"}
    before = server.metric("semantic_shared_blocks_total", published)
    held_before = api.get(f"/v1/agents/{agent}/cache").json()["tokens"]
    last = send(api, agent, "Name a captain.", max_tokens=16)
    held = api.get(f"/v1/agents/{agent}/cache").json()["tokens"]
    touched = -(-held // BLOCK) - held_before // BLOCK  # the blocks the last turn wrote
    eventually(
        lambda: server.metric("semantic_shared_blocks_total", published) >= before + touched,
        "the last turn's blocks are in Redis",
    )
    history = transcript(shared.url, agent)
    shared.kill(shared.servers.index(server))
    fetched = {"event": "fetched"}
    others = [s for s in shared.servers if s.process is not None and s.process.poll() is None]
    before_fetched = [s.metric("semantic_shared_blocks_total", fetched) for s in others]

    resumed = send(api, agent, "Name a river.", max_tokens=16)
    assert resumed.status_code == 200, resumed.text
    assert served_by(resumed) != served_by(last)
    there = shared.servers[shared.index_of(served_by(resumed))]
    then = before_fetched[others.index(there)]
    assert there.metric("semantic_shared_blocks_total", fetched) > then, "read from Redis"
    usage = resumed.json()["usage"]
    assert usage["cached_tokens"] >= 0.9 * last.json()["usage"]["prompt_tokens"], usage
    after = transcript(shared.url, agent)
    assert after[:-2] == history
    assert after[-2:] == [("user", "Name a river."), ("assistant", resumed.json()["content"])]

    cold = OpenAI(
        base_url=f"{shared.url}/v1", api_key="unused", default_headers={"X-Namespace": "cold"}
    ).chat.completions.create(
        model="default",
        messages=openai_messages(
            [
                {"role": "system", "content": RULES},
                *({"role": role, "content": text} for role, text in after[:-1]),
            ]
        ),
        max_tokens=16,
        temperature=0,
    )
    assert cold.usage is not None
    assert cold.usage.prompt_tokens_details is not None
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert cold.usage.prompt_tokens == usage["prompt_tokens"]
    assert cold.usage.completion_tokens == usage["completion_tokens"]
    assert cold.choices[0].message.content == resumed.json()["content"]
