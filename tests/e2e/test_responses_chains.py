"""What a chain of responses carries along and what it refuses: a response's instructions
are its own (OpenAI drops them from the next response), a chain that no longer fits is
refused by field under either ``truncation``, and a response agent a crash left behind is
collected at the next start."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from reliability.server import ServerProcess

from semantic.adapters.storage.sql_metadata import SqlMetadataStore
from semantic.ports.metadata_store import AgentRecord, MessageRecord
from tests.e2e.test_responses import ask, client

pytestmark = pytest.mark.model

Start = Callable[..., ServerProcess]
RULES = " ".join(f"Rule {i}: answer in one short sentence." for i in range(60))


def test_instructions_are_not_carried_to_the_next_response(server: ServerProcess) -> None:
    first = ask(server, "Name a fruit.", instructions=RULES)
    bare = ask(server, "Is it sweet?", previous_response_id=first.id)
    ruled = ask(server, "Is it sweet?", previous_response_id=first.id, instructions=RULES)
    rules_tokens = first.usage.input_tokens - 20  # the rules are most of the first prompt
    assert bare.usage.input_tokens < first.usage.input_tokens - rules_tokens // 2
    assert ruled.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    done = first.usage.input_tokens + first.usage.output_tokens
    assert ruled.usage.input_tokens_details.cached_tokens >= 0.9 * done  # same rules: resumed
    assert client(server).responses.retrieve(bare.id).instructions is None
    on_bare = ask(server, "Why?", previous_response_id=bare.id)  # nor brought back later
    assert on_bare.usage.input_tokens < first.usage.input_tokens
    items = client(server).responses.input_items.list(on_bare.id)
    assert [i.type for i in items.data] == ["message"]


def _post(server: ServerProcess, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/responses",
        json={"model": "default", "max_output_tokens": 4, **body},
        timeout=60,
    )


def test_a_chain_that_no_longer_fits_is_refused_by_field(server: ServerProcess) -> None:
    first = ask(server, "Name a city.")
    agents_before = _response_agents(server)
    huge = "more " * 9000  # past the model's 8192 tokens, with the chain or alone
    for truncation, param in ((None, "input"), ("disabled", "input"), ("auto", "input")):
        body = {"input": huge, "previous_response_id": first.id}
        if truncation is not None:
            body["truncation"] = truncation
        for stream in (False, True):
            refused = _post(server, {**body, "stream": stream})
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert error["param"] == param, error
            assert "context" in error["message"]
            assert "~resp:" not in error["message"]  # no internal agent named
    greedy = _post(server, {"input": "Hi", "previous_response_id": first.id})
    assert greedy.status_code == 200  # the chain is unharmed
    for asked in (4000, 9000):  # past the room the chain leaves; past the server's cap
        too_much = {"input": "Hi " * 4500, "previous_response_id": first.id}
        refused = _post(server, {**too_much, "max_output_tokens": asked, "truncation": "auto"})
        assert (refused.status_code, refused.json()["error"]["param"]) == (400, "max_output_tokens")
        assert "max_tokens" not in refused.json()["error"]["message"]
    assert _response_agents(server) == agents_before + 1  # the refused kept nothing


def _response_agents(server: ServerProcess) -> int:
    with sqlite3.connect(server.data_dir / "semantic.db") as db:
        found = db.execute("SELECT count(*) FROM agents WHERE agent_id LIKE '~resp:%'")
        return int(found.fetchone()[0])


async def _leave_orphans(server: ServerProcess, chained_agent: str) -> None:
    """What kills between a response's commits leave: its agent forked from a kept
    response's, with its turn's messages, but no response pointing at it; a ``store: false``
    response's agent never dropped; one in another namespace."""
    store = SqlMetadataStore(server.data_dir / "semantic.db")
    await store.open()
    try:
        assert await store.fork_agent("default", chained_agent, "~resp:resp_lost", None)
        asked = [MessageRecord("user", "lost"), MessageRecord("assistant", "never told")]
        await store.append_messages("default", "~resp:resp_lost", asked)
        for namespace in ("default", "team-b"):
            unstored = AgentRecord(namespace, "~resp:resp_unstored", keeps_transcript=True)
            await store.create_agent(unstored)
    finally:
        await store.close()


def test_response_agents_a_crash_left_are_collected_at_start(new_server: Start) -> None:
    first_server = new_server()
    first = ask(first_server, "Name three colours.", instructions="Answer briefly.")
    first_server.stop()
    data = first_server.data_dir
    with sqlite3.connect(data / "semantic.db") as db:
        blocks_before = db.execute("SELECT key, ref_count FROM blocks ORDER BY key").fetchall()
    asyncio.run(_leave_orphans(first_server, f"~resp:{first.id}"))
    second_server = new_server(data_dir=data)
    assert _response_agents(second_server) == 1
    with sqlite3.connect(data / "semantic.db") as db:
        blocks_after = db.execute("SELECT key, ref_count FROM blocks ORDER BY key").fetchall()
        lost = db.execute("SELECT count(*) FROM messages WHERE agent_id = '~resp:resp_lost'")
        assert lost.fetchone()[0] == 0
    assert blocks_after == blocks_before  # the kept response's blocks, counted once again
    again = ask(
        second_server, "Which one?", previous_response_id=first.id, instructions="Answer briefly."
    )
    done = first.usage.input_tokens + first.usage.output_tokens
    assert again.usage.input_tokens_details.cached_tokens >= 0.9 * done
    assert "deleted 3 response agents" in second_server.log.read_text()
