"""Corruption: damage stored blocks and rows, then ask again.

    python -m reliability.corruption [--rounds 5]

Each round: an agent converses, the server stops, one kind of damage is done to its stored
blocks (a flipped byte, a truncated file, a deleted file, a row pointing nowhere), the
server restarts, and the agent's next turn must still be answered exactly as a cold run
answers it, with the damage detected, quarantined and counted in the metrics.
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


def damage(data_dir: Path, kind: str, rng: random.Random) -> str:
    with sqlite3.connect(data_dir / "semantic.db") as db:
        keys = [k for (k,) in db.execute("SELECT block_key FROM agent_blocks ORDER BY position")]
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
                "WHERE block_key = ?",
                (len(keys), ghost, keys[-1]),
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
        kind = DAMAGE[index % len(DAMAGE)]
        data_dir = workdir / f"round-{index}"
        server = ServerProcess(data_dir).start()
        words = " ".join(f"item{i}" for i in range(300 + 50 * index))
        history = [{"role": "user", "content": f"Remember these: {words}. Now name one."}]
        first = chat(server, history, {"X-Agent-Id": "victim"})
        history += [
            {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
            {"role": "user", "content": "Name another one."},
        ]
        server.stop()
        damage(data_dir, kind, rng)
        result.injected += 1
        server = ServerProcess(data_dir).start()
        warm = chat(server, history, {"X-Agent-Id": "victim"})
        cold = chat(server, history, {"X-Namespace": "cold"})
        corrupt = server.metric("semantic_corrupt_blocks_total")
        quarantined = (
            list((data_dir / "quarantine").glob("*")) if (data_dir / "quarantine").exists() else []
        )
        found = corrupt >= 1 and (kind in {"dangling row", "delete"} or bool(quarantined))
        result.detected += bool(found)
        if not found:
            result.failures.append(f"round {index} ({kind}): not detected (metric {corrupt})")
        if warm["choices"] == cold["choices"]:
            result.answered_correctly += 1
        else:
            result.failures.append(f"round {index} ({kind}): answer differs from a cold run")
        server.kill()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=8)
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
