"""Agents returning together after a restart, more than the KV budget holds at once.

    python -m reliability.returning_together [--agents 6] [--budget-mb 256] [--words 150]

Each agent's history is restored from disk; the pool cannot hold every restored prefix and
the copy admission makes of it, so some requests wait and their prefixes are let go and read
again at their turn (ADR 0007). Prints, per agent, the prompt tokens and how many were
reported cached, and the slowest reply; a history not reported cached is a failure.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from reliability.server import ServerProcess


@dataclass
class Result:
    cached: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Agent -> (prompt tokens of its first turn, tokens reported cached when it came back)."""
    slowest_s: float = 0.0
    failures: list[str] = field(default_factory=list)


def chat(server: ServerProcess, agent: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    response = httpx.post(
        f"{server.url}/v1/chat/completions",
        headers={"X-Agent-Id": agent},
        json={"model": "default", "messages": messages, "max_tokens": 8, "temperature": 0},
        timeout=600,
    )
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def run(agents: int, budget_mb: int, words: int, workdir: Path) -> Result:
    text = " ".join(f"item{i} is a thing that matters," for i in range(words))
    flags = ("--kv-budget-mb", str(budget_mb))
    histories: dict[str, list[dict[str, str]]] = {}
    first_prompts: dict[str, int] = {}
    server = ServerProcess(workdir / "returning-together", *flags).start()
    try:
        for index in range(agents):
            agent = f"agent-{index}"
            history = [{"role": "user", "content": f"Agent {index}. {text} Summarise."}]
            reply = chat(server, agent, history)
            first_prompts[agent] = reply["usage"]["prompt_tokens"]
            history += [reply["choices"][0]["message"], {"role": "user", "content": "More?"}]
            histories[agent] = history
    finally:
        server.stop()
    server = ServerProcess(workdir / "returning-together", *flags).start()
    result = Result()
    try:

        def come_back(agent: str) -> tuple[str, int, float]:
            started = time.monotonic()
            reply = chat(server, agent, histories[agent])
            cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
            return agent, cached, time.monotonic() - started

        with ThreadPoolExecutor(agents) as pool:
            for agent, cached, seconds in pool.map(come_back, histories):
                result.cached[agent] = (first_prompts[agent], cached)
                result.slowest_s = max(result.slowest_s, seconds)
                if cached < first_prompts[agent]:
                    result.failures.append(
                        f"{agent}: {cached} tokens cached, its history holds {first_prompts[agent]}"
                    )
    finally:
        server.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--agents", type=int, default=6)
    parser.add_argument("--budget-mb", type=int, default=256)
    parser.add_argument("--words", type=int, default=150, help="~10 tokens a word")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.agents, args.budget_mb, args.words, Path(tmp))
    for agent, (history, cached) in result.cached.items():
        print(f"{agent}: history {history} tokens, cached {cached}")
    print(f"slowest reply: {result.slowest_s:.2f} s")
    whole = len(result.cached) - len(result.failures)
    print(f"histories restored whole: {whole} of {len(result.cached)}")
    for failure in result.failures:
        print("  " + failure)


if __name__ == "__main__":
    main()
