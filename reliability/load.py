"""Load: many agents holding conversations at once, through the stateful agents API.

    python -m reliability.load [--agents 32] [--turns 10]

Bounded and self-stopping: each agent sends ``turns`` messages, one after another; all
agents run at once. Checks: no 5xx, no transcript lost (every acknowledged reply is in the
agent's transcript), peak memory reported against the configured budgets, and afterwards
the KV pool holds nothing but the prefix cache (no request kept a block).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from reliability.server import ServerProcess

TOPICS = ("rivers", "castles", "comets", "gardens", "violins", "glaciers", "lanterns", "owls")


@dataclass
class LoadResult:
    requests: int = 0
    server_errors: int = 0
    client_errors: int = 0
    transcripts_lost: int = 0
    seconds: float = 0.0
    peak_rss_mb: float = 0.0
    pool_blocks_held_by_requests: float = 0.0
    failures: list[str] = field(default_factory=list)


def converse(url: str, agent: str, turns: int) -> LoadResult:
    """One agent's conversation, counted on its own (merged after all finish)."""
    result = LoadResult()
    acknowledged = 0
    with httpx.Client(base_url=url, timeout=600) as client:
        created = client.post("/v1/agents", json={"id": agent, "system_prompt": "Be brief."})
        result.requests += 1
        if created.status_code >= 500:
            result.server_errors += 1
            return result
        for turn in range(turns):
            topic = TOPICS[(hash(agent) + turn) % len(TOPICS)]
            reply = client.post(
                f"/v1/agents/{agent}/messages",
                json={"content": f"Tell me one fact about {topic}.", "max_tokens": 16},
            )
            result.requests += 1
            if reply.status_code >= 500:
                result.server_errors += 1
                result.failures.append(
                    f"{agent} turn {turn}: {reply.status_code} {reply.text[:200]}"
                )
            elif reply.status_code >= 400:
                result.client_errors += 1
            else:
                acknowledged += 1
        transcript = client.get(f"/v1/agents/{agent}/messages").json()["data"]
        if len(transcript) != 2 * acknowledged:
            result.transcripts_lost += acknowledged - len(transcript) // 2
            result.failures.append(
                f"{agent}: {len(transcript)} messages for {acknowledged} replies"
            )
    return result


def merge(total: LoadResult, part: LoadResult) -> None:
    total.requests += part.requests
    total.server_errors += part.server_errors
    total.client_errors += part.client_errors
    total.transcripts_lost += part.transcripts_lost
    total.failures += part.failures


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run(agents: int, turns: int, workdir: Path, kv_budget_mb: int = 1024) -> LoadResult:
    result = LoadResult()
    server = ServerProcess(workdir / "load", "--kv-budget-mb", str(kv_budget_mb)).start()
    try:
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(max_workers=agents) as pool:
            for part in pool.map(
                lambda i: converse(server.url, f"agent-{i}", turns), range(agents)
            ):
                merge(result, part)
        result.seconds = time.monotonic() - started
        if server.process is not None:
            result.peak_rss_mb = peak_rss_mb(server.process.pid)
        used = server.metric("semantic_kv_pool_used_blocks")
        cached = server.metric("semantic_kv_cache_blocks")
        result.pool_blocks_held_by_requests = used - cached
        if used != cached:
            result.failures.append(f"after the load {used - cached:.0f} pool blocks are still held")
    finally:
        server.kill()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--agents", type=int, default=32)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--kv-budget-mb", type=int, default=1024)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.agents, args.turns, Path(tmp), args.kv_budget_mb)
    print(
        f"requests served: {result.requests} in {result.seconds:.0f} s, "
        f"5xx: {result.server_errors}, 4xx: {result.client_errors}, "
        f"transcripts lost: {result.transcripts_lost}"
    )
    print(
        f"peak server memory: {result.peak_rss_mb:.0f} MB (KV budget {args.kv_budget_mb} MB + "
        f"weights 538 MB), blocks still held by requests: {result.pool_blocks_held_by_requests:.0f}"
    )
    for failure in result.failures[:20]:
        print("  " + failure)


if __name__ == "__main__":
    main()
