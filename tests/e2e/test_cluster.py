"""Three real instances behind a real HAProxy (the shipped ``deploy/haproxy.cfg``): each
agent lands on one instance, agents spread, streams pass, and a dead instance's agents are
served by another. One cluster for the module: each instance loads the model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI
from reliability.cluster import LocalCluster
from reliability.cluster_load import run_on


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(Path(tmp_path_factory.mktemp("cluster"))) as started:
        yield started


def served_by(response: httpx.Response) -> str:
    """The instance HAProxy sent the request to (the name its config gives it)."""
    assert response.status_code < 500, response.text
    return response.headers["X-Semantic-Instance"]


def client(cluster: LocalCluster, agent: str) -> OpenAI:
    return OpenAI(
        base_url=f"{cluster.url}/v1", api_key="unused", default_headers={"X-Agent-Id": agent}
    )


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
    stream = client(cluster, "streamer").chat.completions.create(
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
    PostgreSQL keeps that correct."""
    if cluster.stores is None or cluster.stores.postgres is None:
        pytest.skip("needs the shared PostgreSQL")
    result = run_on(cluster.url, agents=6, turns=3)
    assert result.server_errors == 0, result.failures
    assert result.transcripts_lost == 0, result.failures
    assert result.client_errors == 0, result.failures
    assert len(result.served_by) >= 2, result.served_by


def test_a_dead_instance_s_agent_is_served_by_another(cluster: LocalCluster) -> None:
    """SIGKILL the agent's instance: its next request (before any health check has seen
    the death: the connection is refused and redispatched) and its next turn succeed
    elsewhere. Last in the module: the cluster stays one instance short."""
    agent = "orphaned"
    home = served_by(httpx.get(f"{cluster.url}/v1/models", headers={"X-Agent-Id": agent}))
    cluster.kill(cluster.index_of(home))
    moved = served_by(httpx.get(f"{cluster.url}/v1/models", headers={"X-Agent-Id": agent}))
    assert moved != home
    reply = client(cluster, agent).chat.completions.with_raw_response.create(
        model="default",
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=8,
        temperature=0,
    )
    assert reply.headers["X-Semantic-Instance"] not in (home, None)
    assert reply.parse().choices[0].message.content
