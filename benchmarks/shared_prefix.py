"""Agents started together with one long system prompt: computed once, or once each?

    python -m benchmarks.shared_prefix [--agents 4,8,12] [--rules 70]

A fresh server; for each N, N agents send their first turn at once (one thread each), all
with the same system prompt (~770 tokens at the default ``--rules``) and their own short
question, 16 tokens each, in a namespace of their own. Nothing of the prompt is stored yet,
so before ADR 0009's last amendment each agent computed it; now the first computes it and the
others copy its KV. Prints the wall time for all N, each agent's time and cached tokens, and
one agent alone in a fresh namespace for scale (N agents one after another would take about
N times that).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.machine import print_machine
from benchmarks.servers import steady_server


def ask(url: str, namespace: str, agent: str, system: str, question: str) -> tuple[float, int, int]:
    """(seconds, prompt tokens, cached tokens) of one agent's first turn."""
    body = {
        "model": "default",
        "temperature": 0,
        "max_tokens": 16,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
    }
    headers = {"X-Agent-Id": agent, "X-Namespace": namespace}
    started = time.perf_counter()
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=600)
    reply.raise_for_status()
    usage = reply.json()["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return time.perf_counter() - started, usage["prompt_tokens"], cached


def burst(url: str, agents: int, system: str) -> None:
    namespace = f"burst-{agents}"
    questions = [f"Question {i}: name a colour." for i in range(agents)]
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=agents) as pool:
        results = list(
            pool.map(
                lambda i: ask(url, namespace, f"agent-{i}", system, questions[i]), range(agents)
            )
        )
    wall = time.perf_counter() - started
    times = [seconds for seconds, _, _ in results]
    cached = [c for _, _, c in results]
    prompt = results[0][1]
    shared = sum(1 for c in cached if c > prompt // 2)
    print(
        f"{agents:>3} agents at once: all done in {wall:6.2f} s (each {min(times):.2f}-"
        f"{max(times):.2f} s); {shared} of {agents} copied the prompt "
        f"(cached: {', '.join(map(str, cached))} of ~{prompt})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", default="4,8,12", help="comma-separated burst sizes")
    parser.add_argument("--rules", type=int, default=70, help="system prompt length, in rules")
    args = parser.parse_args()
    print_machine()
    system = " ".join(f"Rule {i}: keep answers short and kind." for i in range(args.rules))
    with tempfile.TemporaryDirectory() as tmp:
        server = steady_server(Path(tmp) / "data").start()
        try:
            alone, prompt, _ = ask(server.url, "alone", "solo", system, "Name a colour.")
            print(f"one agent alone: {alone:.2f} s for a {prompt}-token prompt")
            for agents in (int(n) for n in args.agents.split(",")):
                burst(server.url, agents, system)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
