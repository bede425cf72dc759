"""Corruption: damage stored blocks and rows, then ask again.

    python -m reliability.corruption [--rounds 5]

Each round: one agent for each kind of damage converses, the server stops, each agent's
stored blocks take their damage (a flipped byte, a truncated file, a deleted file, a row
pointing nowhere), the server restarts, and each agent's next turn must still be answered
exactly as a cold run answers it, with its damage detected, quarantined and counted in
the metrics. (One server for the four kinds: two starts a round, not eight.)
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from reliability.server import ServerProcess

DAMAGE = ("flip", "truncate", "delete", "dangling row")


@dataclass
class Result:
    injected: int = 0
    detected: int = 0
    answered_correctly: int = 0
    failures: list[str] = field(default_factory=list)


def chat(server: ServerProcess, messages: list[dict[str, str]], headers: dict[str, str]) -> dict:  # type: ignore[type-arg]
    body = {"model": "default", "messages": messages, "temperature": 0, "max_tokens": 12}
    response = httpx.post(
        f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=300
    )
    response.raise_for_status()
    return response.json()  # type: ignore[no-any-return]


def damage(data_dir: Path, kind: str, rng: random.Random, agent: str) -> str:
    """One of ``agent``'s blocks damaged (or a row added that points nowhere); its key."""
    with sqlite3.connect(data_dir / "semantic.db") as db:
        keys = [
            k
            for (k,) in db.execute(
                "SELECT block_key FROM agent_blocks WHERE agent_id = ? ORDER BY position", (agent,)
            )
        ]
        key = keys[rng.randrange(len(keys))]
        if kind == "dangling row":  # a row (and a reference) pointing at no file at all
            ghost = "f" * 64
            db.execute(
                "INSERT INTO blocks (key, parent_key, namespace, n_tokens, tokens, nbytes, "
                "checksum, ref_count, tier, created_at) SELECT ?, ?, namespace, n_tokens, "
                "tokens, nbytes, checksum, 1, tier, created_at FROM blocks WHERE key = ?",
                (ghost, keys[-1], key),
            )
            db.execute(
                "INSERT INTO agent_blocks SELECT namespace, agent_id, ?, ? FROM agent_blocks "
                "WHERE block_key = ? AND agent_id = ?",
                (len(keys), ghost, keys[-1], agent),
            )
            return ghost
    path = data_dir / "blocks" / key[:2] / f"{key}.safetensors"
    data = bytearray(path.read_bytes())
    if kind == "flip":
        data[rng.randrange(len(data) // 2, len(data))] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
    elif kind == "truncate":
        path.write_bytes(bytes(data[: rng.randrange(len(data))]))
    else:
        path.unlink()
    return str(key)


def run(rounds: int, workdir: Path, seed: int = 3) -> Result:
    rng = random.Random(seed)
    result = Result()
    for index in range(rounds):
        data_dir = workdir / f"round-{index}"
        server = ServerProcess(data_dir).start()
        histories = {  # each over one block (56 words: ~280 tokens), longer in later rounds
            kind: converse(server, kind, 56 + 50 * index + 4 * n) for n, kind in enumerate(DAMAGE)
        }
        server.stop()
        keys = {kind: damage(data_dir, kind, rng, agent_of(kind)) for kind in DAMAGE}
        result.injected += len(DAMAGE)
        server = ServerProcess(data_dir).start()
        # a missing file's row is quarantined at start, and taken back by the save that
        # replaces the block; a damaged file is found when read, and moved aside for good
        at_start = {kind: quarantined(data_dir, key) for kind, key in keys.items()}
        for kind, history in histories.items():
            warm = chat(server, history, {"X-Agent-Id": agent_of(kind)})
            cold = chat(server, history, {"X-Namespace": "cold"})
            if warm["choices"] == cold["choices"]:
                result.answered_correctly += 1
            else:
                result.failures.append(f"round {index} ({kind}): answer differs from a cold run")
        corrupt = server.metric("semantic_corrupt_blocks_total")
        server.stop()
        for kind, key in keys.items():
            found = at_start[kind] or quarantined(data_dir, key)
            result.detected += found
            if not found:
                result.failures.append(f"round {index} ({kind}): {key[:16]} not quarantined")
        if corrupt < len(DAMAGE):
            result.failures.append(f"round {index}: {corrupt} corrupt blocks counted, not 4")
    return result


def agent_of(kind: str) -> str:
    return "victim-" + kind.replace(" ", "-")


def converse(server: ServerProcess, kind: str, n_words: int) -> list[dict[str, str]]:
    """A first turn of the agent that takes ``kind``; the history its next turn sends."""
    words = " ".join(f"{DAMAGE.index(kind)}item{i}" for i in range(n_words))  # no shared block
    history = [{"role": "user", "content": f"Remember these: {words}. Now name one."}]
    first = chat(server, history, {"X-Agent-Id": agent_of(kind)})
    return [
        *history,
        {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
        {"role": "user", "content": "Name another one."},
    ]


def quarantined(data_dir: Path, key: str) -> bool:
    """A damaged file moved aside, or the row of a missing one marked bad."""
    if any((data_dir / "quarantine").glob(f"{key}.*")):
        return True
    with sqlite3.connect(data_dir / "semantic.db") as db:
        row = db.execute("SELECT tier FROM blocks WHERE key = ?", (key,)).fetchone()
    return row is not None and row[0] == "quarantined"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.rounds, Path(tmp))
    print(
        f"corruptions injected: {result.injected}, detected: {result.detected}, "
        f"answered correctly: {result.answered_correctly}"
    )
    for failure in result.failures:
        print("  " + failure)


if __name__ == "__main__":
    main()
