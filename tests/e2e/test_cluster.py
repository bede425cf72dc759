"""A local cluster (``reliability.cluster``): one PostgreSQL, one Redis, three real
instances with leases, behind a real HAProxy with the shipped ``deploy/haproxy.cfg``. One
cluster for the module (each instance loads the model); the test that kills an instance
comes last.

Routing: each agent lands on one instance, by header or path; agents spread; streams pass.
Issue 37's done-when: a SIGKILLed instance's agent resumes elsewhere from PostgreSQL and
Redis, equal to a cold answer; a short load through the router loses nothing. (Two
instances asked for one agent at once, and one stopped past its lease:
``test_leases_postgres``.)"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI
from reliability.cluster import LocalCluster
from reliability.cluster_load import run_on

from tests.e2e.sdk_types import openai_messages

pytestmark = pytest.mark.model

BLOCK = 256
RULES = " ".join(f"Rule {i}: keep the harbour log in order." for i in range(40))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(Path(tmp_path_factory.mktemp("cluster"))) as started:
        yield started


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


def test_a_short_load_through_the_router_loses_nothing(cluster: LocalCluster) -> None:
    """6 agents x 3 turns at once (the full 24 x 6 is in ``python -m reliability``). Bounded
    load may send an agent's request to another instance than its home: only the shared
    stores and the leases keep that correct."""
    result = run_on(cluster.url, agents=6, turns=3)
    assert result.server_errors == 0, result.failures
    assert result.transcripts_lost == 0, result.failures
    assert result.client_errors == 0, result.failures
    assert len(result.served_by) >= 2, result.served_by


def test_the_dashboard_through_the_router_names_its_instance_and_the_shared_totals(
    cluster: LocalCluster,
) -> None:
    """After the load above: whichever instance answers, the database and Redis totals are
    every instance's."""
    seen: dict[str, str] = {}
    for _ in range(6):
        reply = httpx.get(f"{cluster.url}/v1/dashboard/overview", timeout=30)
        seen[served_by(reply)] = reply.json()["instance"]
        tiers = reply.json()["tiers"]
        assert tiers["shared"]["state"] == "ok"
        assert tiers["shared"]["blocks"] >= 1
        assert tiers["disk"]["database"] == "shared by its instances"
        agents = httpx.get(f"{cluster.url}/v1/dashboard/agents", params={"limit": 500}).json()
        assert agents["total"] >= 6  # the load's agents, wherever they ran
    assert len(set(seen.values())) == len(seen) >= 2, seen  # each names itself


def test_a_killed_instance_s_agent_resumes_on_another_equal_to_cold(
    cluster: LocalCluster,
) -> None:
    """Through the router: an agent's turns go to one instance; SIGKILL it; the next turn
    (sent at once: the refused connection is redispatched) lands on another instance, with
    the transcript intact, at least 90% of the previous prompt from Redis, and the same
    answer as a cold prefill of the same conversation. Last: the cluster stays one short."""
    agent = "survivor"
    api = agent_client(cluster.url, agent)
    created = api.post("/v1/agents", json={"id": agent, "system_prompt": RULES})
    assert created.status_code == 201, created.text
    replies = [send(api, agent, q, max_tokens=16) for q in ("Name a ship.", "Name a port.")]
    home = {served_by(r) for r in [created, *replies]}
    assert len(home) == 1, home
    server = cluster.servers[cluster.index_of(home.pop())]
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
    history = transcript(cluster.url, agent)
    cluster.kill(cluster.servers.index(server))
    fetched = {"event": "fetched"}
    others = [s for s in cluster.servers if s.process is not None and s.process.poll() is None]
    before_fetched = [s.metric("semantic_shared_blocks_total", fetched) for s in others]

    resumed = send(api, agent, "Name a river.", max_tokens=16)
    assert resumed.status_code == 200, resumed.text
    assert served_by(resumed) != served_by(last)
    there = cluster.servers[cluster.index_of(served_by(resumed))]
    then = before_fetched[others.index(there)]
    assert there.metric("semantic_shared_blocks_total", fetched) > then, "read from Redis"
    usage = resumed.json()["usage"]
    assert usage["cached_tokens"] >= 0.9 * last.json()["usage"]["prompt_tokens"], usage
    after = transcript(cluster.url, agent)
    assert after[:-2] == history
    assert after[-2:] == [("user", "Name a river."), ("assistant", resumed.json()["content"])]

    cold = OpenAI(
        base_url=f"{cluster.url}/v1", api_key="unused", default_headers={"X-Namespace": "cold"}
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
