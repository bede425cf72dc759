"""An agent's KV moved between memory and disk by hand: released when it leaves for a
while, prefetched ahead of its next turn (issue 46, item 3)."""

from __future__ import annotations

import time

import httpx
import pytest
from reliability.server import ServerProcess

pytestmark = pytest.mark.model

LONG = " ".join(f"Note {i}: the river bends east past the mill." for i in range(40))


def test_release_leaves_the_kv_on_disk_and_prefetch_brings_it_back(
    server: ServerProcess,
) -> None:
    api = f"{server.url}/v1/agents"
    made = httpx.post(api, json={"id": "memo", "system_prompt": "You keep notes for memo."})
    assert made.status_code == 201

    def ask(text: str) -> dict[str, int]:
        sent = {"content": text, "max_tokens": 8, "temperature": 0}
        reply = httpx.post(f"{api}/memo/messages", json=sent, timeout=120)
        assert reply.status_code == 200, reply.text
        usage: dict[str, int] = reply.json()["usage"]
        return usage

    first = ask(LONG)
    kept = first["prompt_tokens"] + first["completion_tokens"]
    cache = httpx.get(f"{api}/memo/cache").json()
    assert cache["blocks"] >= 2
    released = httpx.post(f"{api}/memo/release").json()
    assert released["released_blocks"] == cache["blocks"]
    assert released["cache"]["hot_blocks"] == 0
    assert released["cache"]["disk_blocks"] == cache["blocks"]  # kept on disk
    assert ask("Where does the river bend?")["cached_tokens"] >= kept - 1  # from disk

    httpx.post(f"{api}/memo/release").raise_for_status()
    fetched = httpx.post(f"{api}/memo/prefetch").json()
    assert fetched["loaded_tokens"] > 0
    assert fetched["cache"]["hot_blocks"] == fetched["cache"]["blocks"]
    again = httpx.post(f"{api}/memo/prefetch").json()
    assert again["loaded_tokens"] == 0  # all in memory already
    assert ask("And the mill?")["cached_tokens"] > kept


def test_release_and_prefetch_of_an_unknown_agent_are_404(server: ServerProcess) -> None:
    for action in ("release", "prefetch"):
        missing = httpx.post(f"{server.url}/v1/agents/nobody-here/{action}")
        assert missing.status_code == 404, missing.text


def test_a_request_naming_the_next_agent_prefetches_it(server: ServerProcess) -> None:
    api = f"{server.url}/v1/agents"
    httpx.post(api, json={"id": "worker", "system_prompt": "You work for worker."})
    sent = {"content": LONG, "max_tokens": 4, "temperature": 0}
    httpx.post(f"{api}/worker/messages", json=sent, timeout=120).raise_for_status()
    assert httpx.post(f"{api}/worker/release").json()["cache"]["hot_blocks"] == 0
    models = httpx.get(f"{server.url}/v1/models", headers={"X-Next-Agent": "worker"})
    assert models.status_code == 200
    deadline = time.monotonic() + 60  # loaded in the background: waited for, not timed
    cache = httpx.get(f"{api}/worker/cache").json()
    while cache["hot_blocks"] < cache["blocks"] and time.monotonic() < deadline:
        time.sleep(0.05)
        cache = httpx.get(f"{api}/worker/cache").json()
    assert cache["hot_blocks"] == cache["blocks"]
    bad = httpx.get(f"{server.url}/v1/models", headers={"X-Next-Agent": "../etc"})
    assert bad.status_code == 400
    assert "X-Next-Agent" in bad.text
