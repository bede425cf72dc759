"""A multi-agent trace with more agents than memory: LRU against the agent policy (ADR 0028).

    python -m benchmarks.agent_trace [--workers 6] [--steps 6] [--seed 7] [--max-tool-s 40]

A supervisor and worker agents run ReAct loops on the agents API, all at once: every turn
must call a tool (``tool_choice: required``, one call a reply), and the tool's result is
the agent's next turn, so histories grow to a few thousand tokens over one shared system
prompt with the tools. A worker's tool takes a heavy-tailed time (log-normal, 0.2 s to
``--max-tool-s``) and returns a few hundred tokens; the supervisor's tool is a worker's
whole task, so it waits 0.4 to 1 times ``--max-tool-s`` and gets a longer report. One
worker in three leaves for ``--max-tool-s`` midway. The memory budget is about half the
trace's working set (``--budget-mb`` to set it) and the disk quota about a third of it
(``--disk-quota-mb``): what the disk cuts is prefilled again from the start, so it is the
policy's choice of whom to cut that shows.

The same seeded trace runs twice in one run, each on a fresh server: ``--eviction lru``
(the baseline: recency alone), then the agent policy with hints (each agent a TTL of its
tools' longest wait, and the supervisor priority 90; the server also holds an agent's KV
while its tools run). Printed for each: the share of prompt tokens restored from memory
and from disk (the server's counters), time to first token p50 and p99 (streamed, as a
client sees it), an agent step p50 and p99 (first token to last), and the total time, with
the machine line. ``mlx_lm.server`` has no agents or tools to replay this trace against:
``python -m benchmarks`` compares the two servers on plain chat instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from reliability.server import ServerProcess

from benchmarks.common import quantile
from benchmarks.machine import print_machine

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": about,
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "what to look for"}},
                "required": ["query"],
            },
        },
    }
    for name, about in (
        ("search_docs", "Search the project's documentation and return matching passages."),
        ("read_file", "Read a file of the repository and return its text."),
        ("run_tests", "Run the test suite on a path and return the failures."),
    )
]
RULES = " ".join(
    f"Rule {i}: work step by step, call one tool at a time and report what it returned."
    for i in range(30)
)
KV_BYTES_PER_TOKEN = 46_080  # SmolLM2-135M in float32 (the server logs its own)
WORDS = ("alpha", "beta", "gamma", "delta", "kappa", "sigma", "omega", "theta", "lambda")


@dataclass(frozen=True)
class Step:
    result_words: int
    tool_s: float
    away_s: float = 0.0
    """A long stretch before this step (an agent that left and came back)."""


@dataclass(frozen=True)
class AgentPlan:
    agent_id: str
    task: str
    steps: tuple[Step, ...]
    retention: str
    """``X-Retention`` for the agent policy's run."""


@dataclass
class Seen:
    ttft_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    failures: int = 0


def plan(workers: int, steps: int, seed: int, max_tool_s: float) -> list[AgentPlan]:
    chance = random.Random(seed)
    agents = []
    for n in range(workers + 1):
        supervisor = n == 0
        waits = [_wait(supervisor, max_tool_s, chance) for _ in range(steps)]
        leaves = not supervisor and n % 3 == 0
        planned = tuple(
            Step(
                chance.randint(300, 500) if supervisor else chance.randint(100, 250),
                wait,
                away_s=max_tool_s if leaves and i == steps // 2 else 0.0,
            )
            for i, wait in enumerate(waits)
        )
        ttl = f"ttl={math.ceil(max(waits)) + 5}"
        hint = f"priority=90, {ttl}" if supervisor else ttl
        agents.append(
            AgentPlan(
                "supervisor" if supervisor else f"worker-{n}",
                f"Task {n}: find why the build of module {n} fails and fix it.",
                planned,
                hint,
            )
        )
    return agents


def _wait(supervisor: bool, max_tool_s: float, chance: random.Random) -> float:
    """A worker's tool: log-normal, most under a few seconds, a tail to ``max_tool_s``. The
    supervisor's tool is a worker's whole task: it waits 0.4 to 1 times ``max_tool_s``."""
    if supervisor:
        return chance.uniform(0.4, 1.0) * max_tool_s
    return min(max_tool_s, max(0.2, chance.lognormvariate(1.0, 1.3)))


def tool_result(words: int, chance: random.Random) -> str:
    return " ".join(chance.choice(WORDS) for _ in range(words))


async def run_agent(
    client: httpx.AsyncClient, agent: AgentPlan, hinted: bool, seed: int, seen: Seen
) -> None:
    headers = {"X-Retention": agent.retention} if hinted else {}
    made = await client.post(
        "/v1/agents", json={"id": agent.agent_id, "system_prompt": RULES}, headers=headers
    )
    made.raise_for_status()
    chance = random.Random(f"{seed}-{agent.agent_id}")
    message: dict[str, Any] = {"content": agent.task}
    for step in agent.steps:
        call_id = await turn(client, agent.agent_id, message, seen)
        if call_id is None:
            message = {"content": "Call one of the tools."}
            continue
        await asyncio.sleep(step.tool_s + step.away_s)
        result = tool_result(step.result_words, chance)
        message = {"role": "tool", "tool_call_id": call_id, "content": result}


async def turn(
    client: httpx.AsyncClient, agent_id: str, message: dict[str, Any], seen: Seen
) -> str | None:
    """One streamed turn; the id of the call it made (None: it made none)."""
    body = {
        **message,
        "tools": TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 48,
        "temperature": 0,
        "stream": True,
    }
    started = time.perf_counter()
    first = last = None
    final: dict[str, Any] = {}
    async with client.stream("POST", f"/v1/agents/{agent_id}/messages", json=body) as reply:
        if reply.status_code != 200:
            seen.failures += 1
            return None
        async for line in reply.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            now = time.perf_counter()
            if event["type"] in ("delta", "tool_call_delta"):
                first = first or now
                last = now
            elif event["type"] == "message":
                final = event
    if first is not None and last is not None:
        seen.ttft_s.append(first - started)
        seen.step_s.append(last - first)
    calls = final.get("tool_calls") or []
    return str(calls[0]["id"]) if calls and final.get("finish_reason") == "tool_calls" else None


def counters(url: str) -> dict[str, float]:
    """The server's prompt-token counters (tokens received, restored from each tier)."""
    text = httpx.get(f"{url}/metrics").text
    wanted = {
        "prompt": r"^semantic_prompt_tokens_total (\S+)",
        "memory": r'^semantic_restored_tokens_total\{tier="memory"\} (\S+)',
        "disk": r'^semantic_restored_tokens_total\{tier="disk"\} (\S+)',
        "cut": r"^semantic_blocks_evicted_from_disk(?:_total)? (\S+)",
    }
    return {k: float(m.group(1)) for k, p in wanted.items() if (m := re.search(p, text, re.M))}


async def run_trace(url: str, agents: list[AgentPlan], hinted: bool, seed: int) -> Seen:
    seen = Seen()
    limits = httpx.Limits(max_connections=len(agents) + 2)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        await asyncio.gather(*(run_agent(client, a, hinted, seed, seen) for a in agents))
    return seen


def report(
    name: str, seen: Seen, before: dict[str, float], after: dict[str, float], s: float
) -> None:
    prompt = max(1.0, after["prompt"] - before["prompt"])
    memory = (after.get("memory", 0) - before.get("memory", 0)) / prompt
    disk = (after.get("disk", 0) - before.get("disk", 0)) / prompt

    cut = after.get("cut", 0) - before.get("cut", 0)

    def ms(values: list[float], q: float) -> str:
        return f"{quantile(values, q) * 1e3:7.0f}" if values else "      -"

    print(
        f"{name:<22} {memory:6.1%} {disk:6.1%} {cut:5.0f}  ttft p50 {ms(seen.ttft_s, 0.5)} p99 "
        f"{ms(seen.ttft_s, 0.99)}  step p50 {ms(seen.step_s, 0.5)} p99 {ms(seen.step_s, 0.99)}"
        f"  total {s:6.1f} s  ({len(seen.ttft_s)} turns, {seen.failures} failed)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-tool-s", type=float, default=40.0)
    parser.add_argument("--budget-mb", type=int, default=0, help="0: half the working set")
    parser.add_argument(
        "--disk-quota-mb", type=int, default=0, help="0: a third of the working set"
    )
    args = parser.parse_args()
    print_machine()
    agents = plan(args.workers, args.steps, args.seed, args.max_tool_s)
    tokens = sum(700 + sum(s.result_words * 2 + 60 for s in a.steps) for a in agents)
    working = tokens * KV_BYTES_PER_TOKEN >> 20
    budget = args.budget_mb or max(64, working // 2)
    disk = args.disk_quota_mb or max(96, working // 3)
    print(
        f"{len(agents)} agents x {args.steps} steps, working set about {tokens} tokens "
        f"({working} MiB of KV); memory budget {budget} MiB, disk quota {disk} MiB"
    )
    print(
        f"{'':<22} {'memory':>6} {'disk':>6} {'cut':>5}  (prompt tokens restored from each "
        "tier; blocks cut from disk; ms)"
    )
    runs = (("lru", "--eviction lru", False), ("agent policy + hints", "--eviction agent", True))
    with tempfile.TemporaryDirectory() as tmp:
        for name, flag, hinted in runs:
            data = Path(tmp) / name.split()[0]
            args_ = ("--kv-budget-mb", str(budget), "--disk-quota-mb", str(disk), *flag.split())
            with ServerProcess(data, *args_).start() as server:
                before = counters(server.url)
                started = time.perf_counter()
                seen = asyncio.run(run_trace(server.url, agents, hinted, args.seed))
                report(name, seen, before, counters(server.url), time.perf_counter() - started)
                server.stop()


if __name__ == "__main__":
    main()
