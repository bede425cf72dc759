"""Two real servers on one PostgreSQL, one agent (ADR 0025; issue 37's done-when): asked at
once, one turn runs and the other waits or gets the 409, and the transcript has no fork and
no lost turn; a server stopped with SIGSTOP past its lease, then resumed, cannot commit
its turn."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

import httpx
import pytest
from reliability.server import ServerProcess
from reliability.services.postgres import PostgresServer
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

pytestmark = pytest.mark.model

LEASE = ("--lease-seconds", "2", "--lease-wait", "1")
DEADLINE_S = 90.0


@pytest.fixture(scope="module")
def database(postgres: PostgresServer) -> str:
    return postgres.create_database("leased_agents")


@pytest.fixture(scope="module")
def pair(
    database: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    first = ServerProcess(tmp_path_factory.mktemp("a"), "--database-url", database, *LEASE)
    second = ServerProcess(tmp_path_factory.mktemp("b"), "--database-url", database, *LEASE)
    with first, second:
        yield first.start(), second.start()


def transcript(server: ServerProcess, agent_id: str) -> list[tuple[str, str]]:
    found = httpx.get(f"{server.url}/v1/agents/{agent_id}/messages", timeout=30).json()["data"]
    return [(m["role"], m["content"]) for m in found]


def test_one_agent_asked_on_two_servers_at_once_keeps_one_unforked_transcript(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair
    httpx.post(f"{a.url}/v1/agents", json={"id": "both"}).raise_for_status()

    def ask(server: ServerProcess, question: str) -> httpx.Response:
        turn = {"content": question, "max_tokens": 8}
        return httpx.post(f"{server.url}/v1/agents/both/messages", json=turn, timeout=120)

    answered: list[str] = []
    with ThreadPoolExecutor(2) as pool:
        for round_ in range(3):
            questions = {a: f"Round {round_}: name a colour.", b: f"Round {round_}: name a fruit."}
            replies = dict(
                zip(questions, pool.map(ask, questions, questions.values()), strict=True)
            )
            codes = sorted(reply.status_code for reply in replies.values())
            assert codes in ([200, 200], [200, 409]), [r.text for r in replies.values()]
            for server, reply in replies.items():
                if reply.status_code == 409:
                    assert reply.json()["error"]["code"] == "agent_busy"
                    assert int(reply.headers["Retry-After"]) >= 1
                else:
                    answered.append(questions[server])
    kept = transcript(a, "both")
    assert kept == transcript(b, "both")
    assert [role for role, _ in kept] == ["user", "assistant"] * len(answered)
    asked = [content for role, content in kept if role == "user"]
    assert sorted(asked) == sorted(answered), "every answered turn is kept, once"


@asynccontextmanager
async def database_engine(url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(url)
    try:
        yield engine
    finally:
        await engine.dispose()


async def stop_between_writes(server: ServerProcess, engine: AsyncEngine, agent_id: str) -> None:
    """SIGSTOP ``server`` where it holds no lock on the agent's lease row (a stop inside a
    renewal would hold the row, and the other server's take would wait for it)."""
    assert server.process is not None
    for _ in range(20):
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            async with engine.begin() as connection:
                await connection.execute(
                    text("SELECT 1 FROM agent_leases WHERE agent_id = :a FOR UPDATE NOWAIT"),
                    {"a": agent_id},
                )
            return
        except DBAPIError:
            os.kill(server.process.pid, signal.SIGCONT)
            time.sleep(0.05)
    pytest.fail("the server kept the lease row locked")


async def test_a_server_stopped_past_its_lease_cannot_commit_its_turn(
    pair: tuple[ServerProcess, ServerProcess], database: str
) -> None:
    a, b = pair
    assert a.process is not None
    httpx.post(f"{a.url}/v1/agents", json={"id": "paused"}).raise_for_status()
    long_turn = {"content": "Count from 1 to 1000.", "max_tokens": 150, "stream": True}
    events: list[str] = []
    data = ""
    async with database_engine(database) as engine:
        api = f"{a.url}/v1/agents/paused/messages"
        with httpx.stream("POST", api, json=long_turn, timeout=120) as stream:
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    events.append(line.removeprefix("event: "))
                data = line.removeprefix("data: ") if line.startswith("data: ") else data
                if events == ["delta"]:  # the turn runs on ``a``, under its lease
                    events.append("stopped")
                    await stop_between_writes(a, engine, "paused")
                    try:
                        answer = turn_when_free(b, "paused", "Say hi.")
                    finally:
                        os.kill(a.process.pid, signal.SIGCONT)
    assert events[-1] == "error", events
    assert "lost agent 'paused'" in data, data
    kept = transcript(b, "paused")
    assert kept == [("user", "Say hi."), ("assistant", answer)], "only b's turn, no fork"
    assert transcript(a, "paused") == kept


def turn_when_free(server: ServerProcess, agent_id: str, question: str) -> str:
    """The turn, sent again after each 409 until the other server's lease has expired."""
    deadline = time.monotonic() + DEADLINE_S
    api = f"{server.url}/v1/agents/{agent_id}/messages"
    while True:
        reply = httpx.post(api, json={"content": question, "max_tokens": 4}, timeout=120)
        if reply.status_code != 409:
            assert reply.status_code == 200, reply.text
            return str(reply.json()["content"])
        assert time.monotonic() < deadline, "the stopped server's lease never expired"
