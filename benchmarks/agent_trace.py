"""A multi-agent trace with more agents than memory: LRU against the agent policy (ADR 0028).

    python -m benchmarks.agent_trace [--teams 3] [--workers 4] [--steps 4] [--seed 7]

Teams run at once, each a supervisor that hands its task to workers one after another, the
shape of LangGraph's supervisor or CrewAI's hierarchical crew. Every agent is a ReAct loop
on the agents API over one shared system prompt with the tools: a supervisor's turn calls
``delegate`` and the tool's result is that worker's report, a few hundred words, so the
supervisor waits a worker's whole task between its turns, idle for a long stretch while
its history grows to several thousand tokens. A worker's turns call ``search_docs``,
``read_file`` or ``run_tests`` (``tool_choice: required``); each tool takes a heavy-tailed
time (log-normal, 0.2 s to ``--max-tool-s``) and returns a hundred to a few hundred words;
its last turn is its answer (``tool_choice: none``), and then it is done and never comes
back. The memory budget is about half the trace's working set (``--budget-mb``) and the
disk quota two fifths of it (``--disk-quota-mb``): what the disk cuts is prefilled again.

So the question the trace asks of a policy is the one agent traffic asks: keep the agent
that has been quiet longest but is coming back (a supervisor waiting on its worker), or
the agents that were used last but are done (finished workers)? Recency keeps the latter.

The same seeded trace runs twice in one run, each on a fresh server: ``--eviction lru``
(the baseline: recency alone), then the agent policy with the hints a framework knows to
send: each supervisor ``priority=90, ttl=300`` and each worker a TTL of its tools' longest
wait (``X-Retention``); the server also holds an agent's KV while its tools run. Printed
for each: the share of prompt tokens restored from memory and from disk (the server's
counters), the blocks cut from disk, time to first token p50 and p99 (streamed, as a
client sees it), an agent step p50 and p99 (first token to last), the total time and the
slowest first tokens with the tokens each computed, with the machine line.
``mlx_lm.server`` has no agents or tools to replay this trace against: ``python -m
benchmarks`` compares the two servers on plain chat instead.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
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


def _tool(name: str, about: str, field: str) -> dict[str, Any]:
    parameters = {
        "type": "object",
        "properties": {field: {"type": "string", "description": f"the {field}"}},
        "required": [field],
    }
    return {
        "type": "function",
        "function": {"name": name, "description": about, "parameters": parameters},
    }


TOOLS = [
    _tool("delegate", "Hand a part of the task to a worker and return its report.", "task"),
    _tool("search_docs", "Search the project's documentation and return passages.", "query"),
    _tool("read_file", "Read a file of the repository and return its text.", "path"),
    _tool("run_tests", "Run the test suite on a path and return the failures.", "path"),
]
RULES = " ".join(
    f"Rule {i}: work step by step, call one tool at a time and report what it returned."
    for i in range(30)
)
KV_BYTES_PER_TOKEN = 46_080  # SmolLM2-135M in float32 (the server logs its own)
SHARED_TOKENS = 950  # the rules and the tools, as the embedded model's template renders them
TURN_TOKENS = 60  # a turn's own: the task or the call made, the template's markers
WORDS = ("alpha", "beta", "gamma", "delta", "kappa", "sigma", "omega", "theta", "lambda")


@dataclass(frozen=True)
class Worker:
    agent_id: str
    task: str
    tools: tuple[tuple[float, int], ...]
    """Each tool call's time and the words of its result."""
    report_words: int
    """The report its supervisor gets as ``delegate``'s result."""


@dataclass(frozen=True)
class Team:
    supervisor: str
    task: str
    waves: tuple[tuple[Worker, ...], ...]
    """Each ``delegate`` call's workers, who run at once."""


@dataclass(frozen=True)
class Hints:
    """``X-Retention`` for the agent policy's run (None: the LRU run sends none)."""

    supervisor: str | None
    worker: str | None


@dataclass(frozen=True)
class TurnSeen:
    agent_id: str
    ttft_s: float
    step_s: float
    """First token to last."""
    prompt_tokens: int
    computed: int
    """Prompt tokens the turn computed (not restored from any tier)."""


@dataclass
class Seen:
    turns: list[TurnSeen] = field(default_factory=list)
    failures: int = 0


def plan(
    teams: int, waves: int, workers: int, steps: int, *, seed: int, max_tool_s: float
) -> list[Team]:
    chance = random.Random(seed)

    def worker(t: int, v: int, w: int) -> Worker:
        tools = tuple((_wait(max_tool_s, chance), chance.randint(100, 250)) for _ in range(steps))
        return Worker(
            f"worker-{t}-{v}-{w}",
            f"Find why module {t}.{v}.{w} fails to build and say how to fix it.",
            tools,
            chance.randint(300, 500),
        )

    return [
        Team(
            f"supervisor-{t}",
            f"Task {t}: the build of package {t} fails; find every cause and fix it.",
            tuple(tuple(worker(t, v, w) for w in range(workers)) for v in range(waves)),
        )
        for t in range(teams)
    ]


def _wait(max_tool_s: float, chance: random.Random) -> float:
    """A tool's time: log-normal, most under a few seconds, a tail to ``max_tool_s``."""
    return min(max_tool_s, max(0.2, chance.lognormvariate(1.0, 1.3)))


def working_set(teams: list[Team]) -> int:
    """The trace's tokens at its end, about: the shared system prompt with the tools once,
    then every agent's own history."""
    tokens = SHARED_TOKENS
    for team in teams:
        tokens += 2 * TURN_TOKENS
        for wave in team.waves:
            tokens += TURN_TOKENS + sum(_tokens(w.report_words) for w in wave)
            for w in wave:
                tokens += 2 * TURN_TOKENS + sum(TURN_TOKENS + _tokens(n) for _, n in w.tools)
    return tokens


def _tokens(words: int) -> int:
    return words * 11 // 10  # the tool results' words, as the embedded tokenizer counts them


def hints(max_tool_s: float) -> Hints:
    """What a framework knows: a supervisor matters most and waits its workers' tasks
    (Anthropic's five-minute TTL); a worker waits its tools at most ``max_tool_s``."""
    return Hints("priority=90, ttl=300", f"ttl={math.ceil(max_tool_s) + 5}")


def words(n: int, chance: random.Random) -> str:
    return " ".join(chance.choice(WORDS) for _ in range(n))


async def run_team(
    client: httpx.AsyncClient, team: Team, told: Hints, seed: int, seen: Seen
) -> None:
    """Each of the supervisor's ``delegate`` calls hands the task to a wave of workers, who
    run at once; their reports are the call's result, when the last of them is done."""
    await make(client, team.supervisor, told.supervisor)
    message: dict[str, Any] = {"content": team.task}
    for wave in team.waves:
        call_id = await turn(client, team.supervisor, message, seen)
        await asyncio.gather(*(run_worker(client, w, told.worker, seed, seen) for w in wave))
        chance = random.Random(f"{seed}-{team.supervisor}-{wave[0].agent_id}")
        report = "\n".join(f"{w.agent_id}: {words(w.report_words, chance)}" for w in wave)
        message = (
            {"role": "tool", "tool_call_id": call_id, "content": report}
            if call_id
            else {"content": f"The workers reported: {report}"}
        )
    await turn(client, team.supervisor, message, seen, choice="none")


async def run_worker(
    client: httpx.AsyncClient, worker: Worker, retention: str | None, seed: int, seen: Seen
) -> None:
    """A ReAct loop: a tool call a turn, the tool's result the next turn, then an answer."""
    await make(client, worker.agent_id, retention)
    chance = random.Random(f"{seed}-{worker.agent_id}")
    message: dict[str, Any] = {"content": worker.task}
    for tool_s, result_words in worker.tools:
        call_id = await turn(client, worker.agent_id, message, seen)
        await asyncio.sleep(tool_s)
        result = words(result_words, chance)
        message = (
            {"role": "tool", "tool_call_id": call_id, "content": result}
            if call_id
            else {"content": f"Call one of the tools. Earlier: {result}"}
        )
    await turn(client, worker.agent_id, message, seen, choice="none")


async def make(client: httpx.AsyncClient, agent_id: str, retention: str | None) -> None:
    headers = {"X-Retention": retention} if retention else {}
    made = await client.post(
        "/v1/agents", json={"id": agent_id, "system_prompt": RULES}, headers=headers
    )
    made.raise_for_status()


async def turn(
    client: httpx.AsyncClient,
    agent_id: str,
    message: dict[str, Any],
    seen: Seen,
    choice: str = "required",
) -> str | None:
    """One streamed turn; the id of the call it made (None: it made none)."""
    body = {
        **message,
        "tools": TOOLS,
        "tool_choice": choice,
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
        usage = final.get("usage") or {}
        prompt = usage.get("prompt_tokens", 0)
        computed = prompt - usage.get("cached_tokens", 0)
        seen.turns.append(TurnSeen(agent_id, first - started, last - first, prompt, computed))
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


async def warm_up(url: str) -> None:
    """One turn of an agent that is not in the trace, before the clock starts: the shared
    system prompt with the tools is then cached, as on a server that has seen traffic, so
    no policy is charged for the first prefill of it."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await make(client, "warm-up", None)
        await turn(client, "warm-up", {"content": "Say hello."}, Seen())


async def run_trace(url: str, teams: list[Team], told: Hints, seed: int) -> Seen:
    seen = Seen()
    limits = httpx.Limits(max_connections=2 * len(teams) + 2)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        await asyncio.gather(*(run_team(client, team, told, seed, seen) for team in teams))
    return seen


def report(
    name: str, seen: Seen, before: dict[str, float], after: dict[str, float], s: float
) -> None:
    prompt = max(1.0, after["prompt"] - before["prompt"])
    memory = (after.get("memory", 0) - before.get("memory", 0)) / prompt
    disk = (after.get("disk", 0) - before.get("disk", 0)) / prompt

    cut = after.get("cut", 0) - before.get("cut", 0)

    ttft = [t.ttft_s for t in seen.turns]
    step = [t.step_s for t in seen.turns]

    def ms(values: list[float], q: float) -> str:
        return f"{quantile(values, q) * 1e3:7.0f}" if values else "      -"

    print(
        f"{name:<22} {memory:6.1%} {disk:6.1%} {cut:5.0f}  ttft p50 {ms(ttft, 0.5)} p99 "
        f"{ms(ttft, 0.99)}  step p50 {ms(step, 0.5)} p99 {ms(step, 0.99)}"
        f"  total {s:6.1f} s  ({len(ttft)} turns, {seen.failures} failed)",
        flush=True,
    )
    slowest = sorted(seen.turns, key=lambda t: t.ttft_s, reverse=True)[:5]
    print(
        f"{'':<22} slowest first tokens (agent ms computed/prompt tokens): "
        + ", ".join(
            f"{t.agent_id} {t.ttft_s * 1e3:.0f} {t.computed}/{t.prompt_tokens}" for t in slowest
        ),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teams", type=int, default=2)
    parser.add_argument("--waves", type=int, default=4, help="delegate calls per team")
    parser.add_argument("--workers", type=int, default=3, help="per wave, at once")
    parser.add_argument("--steps", type=int, default=3, help="tool calls per worker")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-tool-s", type=float, default=40.0)
    parser.add_argument("--budget-mb", type=int, default=0, help="0: half the working set")
    parser.add_argument(
        "--disk-quota-mb", type=int, default=0, help="0: two fifths of the working set"
    )
    parser.add_argument("--turns-out", type=Path, help="append every turn here, a JSON line each")
    args = parser.parse_args()
    print_machine()
    teams = plan(
        args.teams, args.waves, args.workers, args.steps, seed=args.seed, max_tool_s=args.max_tool_s
    )
    tokens = working_set(teams)
    working = tokens * KV_BYTES_PER_TOKEN >> 20
    budget = args.budget_mb or max(64, working // 2)
    disk = args.disk_quota_mb or max(96, working * 2 // 5)
    agents = len(teams) * (1 + args.waves * args.workers)
    print(
        f"{len(teams)} teams, {agents} agents, {args.steps} tool calls a worker; working set "
        f"about {tokens} tokens ({working} MiB of KV); memory budget {budget} MiB, disk "
        f"quota {disk} MiB"
    )
    print(
        f"{'':<22} {'memory':>6} {'disk':>6} {'cut':>5}  (prompt tokens restored from each "
        "tier; blocks cut from disk; ms)"
    )
    runs = (
        ("lru", "--eviction lru", Hints(None, None)),
        ("agent policy + hints", "--eviction agent", hints(args.max_tool_s)),
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name, flag, told in runs:
            data = Path(tmp) / name.split()[0]
            args_ = ("--kv-budget-mb", str(budget), "--disk-quota-mb", str(disk), *flag.split())
            with ServerProcess(data, *args_).start() as server:
                asyncio.run(warm_up(server.url))
                before = counters(server.url)
                started = time.perf_counter()
                seen = asyncio.run(run_trace(server.url, teams, told, args.seed))
                report(name, seen, before, counters(server.url), time.perf_counter() - started)
                if args.turns_out:
                    with args.turns_out.open("a") as out:
                        out.writelines(
                            json.dumps({"run": name, **dataclasses.asdict(t)}) + "\n"
                            for t in seen.turns
                        )
                server.stop()


if __name__ == "__main__":
    main()
