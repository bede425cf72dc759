"""Kill -9 the server at random moments while Responses chains grow, restart, and check.

    python -m reliability.crash_responses [--trials 20] [--chains 3] [--seed 1]

Each trial: chains of ``/v1/responses`` on ``previous_response_id`` run until a kill -9 at a
random moment after the first acknowledged response. After the restart, every response whose
200 reached the client must be retrievable with its input items, and each chain's next turn
must report at least the last acknowledged response's tokens as cached; no metadata row may
point at a missing or corrupt block file.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from reliability.crash_saves import QUESTIONS
from reliability.integrity import block_problems
from reliability.server import ServerProcess
from reliability.trials import each_trial, print_failures


@dataclass
class Chain:
    acknowledged: list[str] = field(default_factory=list)
    tokens: int = 0
    """The last acknowledged response's input plus output tokens."""


@dataclass
class Summary:
    trials: int = 0
    survived: int = 0
    acknowledged: int = 0
    checked_chains: int = 0
    failures: list[str] = field(default_factory=list)


def respond(url: str, text: str, previous: str | None) -> dict[str, Any]:
    body = {"model": "default", "input": text, "temperature": 0, "max_output_tokens": 12}
    if previous is not None:
        body["previous_response_id"] = previous
    reply = httpx.post(f"{url}/v1/responses", json=body, timeout=120)
    reply.raise_for_status()
    result: dict[str, Any] = reply.json()
    return result


def grow(
    url: str, chain: Chain, rng: random.Random, stop: threading.Event, acked: threading.Event
) -> None:
    while not stop.is_set():
        previous = chain.acknowledged[-1] if chain.acknowledged else None
        try:
            reply = respond(url, rng.choice(QUESTIONS), previous)
        except httpx.HTTPError:
            return
        chain.acknowledged.append(reply["id"])
        chain.tokens = reply["usage"]["input_tokens"] + reply["usage"]["output_tokens"]
        acked.set()


def trial(data_dir: Path, index: int, chains: int, rng: random.Random, summary: Summary) -> None:
    grown = [Chain() for _ in range(chains)]
    with ServerProcess(data_dir).start() as server:
        stop, acked = threading.Event(), threading.Event()
        threads = [
            threading.Thread(
                target=grow, args=(server.url, c, random.Random(rng.random()), stop, acked)
            )
            for c in grown
        ]
        server.kill_during(threads, stop, rng.uniform(0.5, 4.0), acked)
    summary.trials += 1
    with ServerProcess(data_dir).start() as server:
        orphans = orphan_agents(data_dir)  # the start collected them, before any new turn
        checked = [check(server.url, index, c, summary) for c in grown]
    ok = all(checked) and not orphans
    if orphans:
        summary.failures.append(f"trial {index}: {orphans} response agents no response owns")
    problems = block_problems(data_dir)
    if problems:
        ok = False
        summary.failures += [f"trial {index}: {p}" for p in problems]
    summary.survived += ok


ORPHANS = """SELECT count(*) FROM agents WHERE agent_id LIKE '~resp:%' AND NOT EXISTS
    (SELECT 1 FROM api_objects WHERE api_objects.namespace = agents.namespace
     AND kind = 'chain' AND agents.agent_id =
     CASE WHEN body LIKE '{%' THEN json_extract(body, '$.agent') ELSE body END)"""
"""A chain row's body is its agent's id, or JSON naming it (``responses.chain_body``)."""


def orphan_agents(data_dir: Path) -> int:
    """Response agents no stored response points at (what a kill between commits leaves)."""
    with sqlite3.connect(data_dir / "semantic.db") as db:
        return int(db.execute(ORPHANS).fetchone()[0])


def check(url: str, index: int, chain: Chain, summary: Summary) -> bool:
    if not chain.acknowledged:
        return True
    ok = True
    summary.acknowledged += len(chain.acknowledged)
    for response_id in chain.acknowledged:
        found = httpx.get(f"{url}/v1/responses/{response_id}", timeout=30)
        items = httpx.get(f"{url}/v1/responses/{response_id}/input_items", timeout=30)
        if found.status_code != 200 or items.status_code != 200 or not items.json()["data"]:
            ok = False
            summary.failures.append(f"trial {index}: {response_id} lost ({found.status_code})")
    follow = respond(url, "Thanks. One more, please.", chain.acknowledged[-1])
    cached = follow["usage"]["input_tokens_details"]["cached_tokens"]
    summary.checked_chains += 1
    if cached < chain.tokens - 1:
        ok = False
        summary.failures.append(f"trial {index}: cached {cached} < acknowledged {chain.tokens}")
    return ok


def run(trials: int, chains: int = 3, seed: int = 1, workdir: Path | None = None) -> Summary:
    summary = Summary()
    each_trial(trials, seed, workdir, lambda d, i, rng: trial(d, i, chains, rng, summary))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--chains", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    started = time.monotonic()
    summary = run(args.trials, args.chains, args.seed)
    print(f"crash trials: {summary.trials}, survived: {summary.survived}")
    print(
        f"responses acknowledged before kills: {summary.acknowledged}, "
        f"chains checked after restart: {summary.checked_chains}"
    )
    print_failures(summary.failures)
    print(f"took {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
