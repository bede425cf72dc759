"""One instance per agent at a time, through a real server started with ``--leases`` on its
SQLite file. The other instance is this test process: it takes the agent's lease in the
same database with the same adapter another server would use (ADR 0025). Two real servers
on one PostgreSQL, and one stopped past its lease: ``test_leases_postgres``."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from reliability.server import ServerProcess

from semantic.adapters.storage.sql_leases import SqlLeases
from semantic.adapters.storage.sql_metadata import SqlMetadataStore
from semantic.domain.errors import AgentBusyError, StorageUnavailableError
from semantic.ports.leases import Lease

pytestmark = pytest.mark.model
same_loop = pytest.mark.asyncio(loop_scope="session")
"""The loop the ``other`` instance's store opened on."""

LEASE_S = 1.0
WAIT_S = 3.0
DEADLINE_S = 60.0
NS = "default"


@pytest.fixture(scope="module")
def leased(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("leased")
    args = ("--leases", "--lease-seconds", str(LEASE_S), "--lease-wait", str(WAIT_S))
    with ServerProcess(data, *args) as server:
        yield server.start()


class OtherInstance:
    """Another instance on the server's database: its leases and its transcript writes."""

    def __init__(self, path: Path) -> None:
        self.metadata = SqlMetadataStore(path)
        self.leases = SqlLeases(self.metadata.engine)

    async def take(self, agent_id: str, seconds: float) -> Lease:
        return await self.leases.take(NS, agent_id, "other-host:1:cafe", seconds)

    async def take_when_free(self, agent_id: str, seconds: float) -> Lease:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            try:
                return await self.take(agent_id, seconds)
            except (AgentBusyError, StorageUnavailableError):
                assert time.monotonic() < deadline, "the lease never came free"
                time.sleep(0.05)


@pytest.fixture
async def other(leased: ServerProcess) -> AsyncIterator[OtherInstance]:
    instance = OtherInstance(leased.data_dir / "semantic.db")
    await instance.metadata.open()
    yield instance
    await instance.metadata.close()


def create(server: ServerProcess, agent_id: str) -> str:
    api = f"{server.url}/v1/agents"
    httpx.post(api, json={"id": agent_id}).raise_for_status()
    return f"{api}/{agent_id}"


def contents(agent: str) -> list[str]:
    return [m["content"] for m in httpx.get(f"{agent}/messages").json()["data"]]


@same_loop
async def test_a_turn_waits_for_a_lease_let_go_and_gets_a_409_for_one_held(
    leased: ServerProcess, other: OtherInstance
) -> None:
    agent = create(leased, "shared")
    turn = {"content": "Say hi.", "max_tokens": 4}
    await other.take("shared", 0.5)  # ends within the server's wait: the turn waits for it
    assert httpx.post(f"{agent}/messages", json=turn, timeout=60).status_code == 200
    await other.take_when_free("shared", 600.0)
    busy = httpx.post(f"{agent}/messages", json=turn, timeout=60)
    assert busy.status_code == 409
    error = busy.json()["error"]
    assert error["code"] == "agent_busy"
    assert error["type"] == "conflict_error"
    assert "busy on another instance" in error["message"]
    assert 500 <= int(busy.headers["Retry-After"]) <= 600
    assert len(contents(agent)) == 2, "the refused turn kept nothing"


def test_forks_and_deletes_take_the_lease_and_a_deleted_agent_leaves_none(
    leased: ServerProcess,
) -> None:
    agent = create(leased, "forked")
    turn = {"content": "Say hi.", "max_tokens": 4}
    httpx.post(f"{agent}/messages", json=turn, timeout=60).raise_for_status()
    httpx.post(f"{agent}/fork", json={"id": "fork"}, timeout=60).raise_for_status()
    fork = f"{leased.url}/v1/agents/fork"
    assert contents(fork) == contents(agent)
    httpx.post(f"{fork}/messages", json=turn, timeout=60).raise_for_status()
    assert httpx.delete(fork, timeout=60).status_code == 204
    with sqlite3.connect(leased.data_dir / "semantic.db") as database:
        rows = dict(database.execute("SELECT agent_id, expires_at FROM agent_leases").fetchall())
    assert "fork" not in rows, "the deleted agent's lease went with it"
    assert rows["forked"] == 0.0, "a turn lets its lease go at its end"


@same_loop
async def test_plain_requests_naming_a_busy_agent_get_a_409_in_their_clients_shape(
    leased: ServerProcess, other: OtherInstance
) -> None:
    await other.take("plain", 600.0)
    who = {"X-Agent-Id": "plain"}
    openai_client = openai.OpenAI(
        base_url=f"{leased.url}/v1", api_key="unused", default_headers=who, max_retries=0
    )
    with pytest.raises(openai.ConflictError) as refused:
        openai_client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "Hi."}], max_tokens=4
        )
    assert refused.value.code == "agent_busy"
    assert int(refused.value.response.headers["Retry-After"]) > 500
    anthropic_client = anthropic.Anthropic(
        base_url=leased.url, api_key="unused", default_headers=who, max_retries=0
    )
    with pytest.raises(anthropic.ConflictError) as busy:
        anthropic_client.messages.create(
            model="default", messages=[{"role": "user", "content": "Hi."}], max_tokens=4
        )
    assert "busy on another instance" in busy.value.message
    assert busy.value.response.json()["error"]["type"] == "invalid_request_error"
    other_request = openai_client.with_options(default_headers={"X-Agent-Id": "free"})
    reply = other_request.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Hi."}], max_tokens=4
    )
    assert reply.choices[0].message.content is not None, "another agent is not held up"
