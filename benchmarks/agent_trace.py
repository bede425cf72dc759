"""A multi-agent trace with more agents than memory: LRU against the agent policy (ADR 0028).

    python -m benchmarks.agent_trace [--teams 2] [--waves 4] [--workers 3] [--steps 3]
        [--seed 7] [--turns-out FILE] [--urgent-supervisors] [--mlx-lm MODEL_DIR]

Teams run at once, each a supervisor that fans its task out to waves of workers: the shape
of LangGraph's supervisor with ``Send``, CrewAI's hierarchical crew, or the Agents SDK's
agents called as tools in parallel. Every agent is a ReAct loop on the agents API over one
shared system prompt with the tools. A supervisor's turn calls ``delegate``; the wave's
workers run at once, and their reports (a few hundred words each) are the call's result
when the last of them is done. So the supervisor waits the wave's longest task between
its turns, idle for a long stretch while its history grows to several thousand tokens.
A worker's turns call ``search_docs``, ``read_file`` or ``run_tests`` (``tool_choice:
required``); each tool takes a heavy-tailed time (log-normal, 0.2 s to ``--max-tool-s``)
and returns a hundred to a few hundred words; its last turn is its answer (``tool_choice:
none``), and then it is done and never comes back. The memory budget is about half the
trace's working set (``--budget-mb``) and the disk quota two fifths of it
(``--disk-quota-mb``): what the disk cuts is prefilled again.

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
slowest first tokens with the tokens each computed, and when each team ended beside its
supervisor's turns and its tools' floor (each wave's longest chain of tool waits), with the
machine line.
``--mlx-lm MODEL_DIR`` replays the same trace on ``mlx_lm.server`` for reference, through
chat completions (the client sends each agent's whole history every turn; its prompt cache
held to the memory budget, and it has no disk tier).
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import quantile
from benchmarks.concurrency import MlxLmServer
from benchmarks.machine import print_machine
from benchmarks.servers import steady_server
from benchmarks.trace_doors import AgentsDoor, ChatDoor, Door, Message, Seen


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
    """``X-Retention`` for the agent policy's run (None: the LRU run sends none), and the
    ``X-Priority`` of a supervisor's turns (None: none sent)."""

    supervisor: str | None
    worker: str | None
    supervisor_turns: str | None = None


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


def hints(max_tool_s: float, *, urgent: bool = False) -> Hints:
    """What a framework knows: a supervisor matters most and waits its workers' tasks
    (Anthropic's five-minute TTL); a worker waits its tools at most ``max_tool_s``; and
    (``urgent``) the workers wait on a supervisor's turn, so it may go first
    (``X-Priority: high``)."""
    return Hints(
        "priority=90, ttl=300", f"ttl={math.ceil(max_tool_s) + 5}", "high" if urgent else None
    )


def words(n: int, chance: random.Random) -> str:
    return " ".join(chance.choice(WORDS) for _ in range(n))


async def run_team(door: Door, team: Team, told: Hints, seed: int) -> None:
    """Each of the supervisor's ``delegate`` calls hands the task to a wave of workers, who
    run at once; their reports are the call's result, when the last of them is done."""
    await door.make(team.supervisor, told.supervisor)
    message: Message = {"content": team.task}
    for wave in team.waves:
        call_id = await door.turn(team.supervisor, message, priority=told.supervisor_turns)
        await asyncio.gather(*(run_worker(door, w, told.worker, seed) for w in wave))
        chance = random.Random(f"{seed}-{team.supervisor}-{wave[0].agent_id}")
        report = "\n".join(f"{w.agent_id}: {words(w.report_words, chance)}" for w in wave)
        message = (
            {"role": "tool", "tool_call_id": call_id, "content": report}
            if call_id
            else {"content": f"The workers reported: {report}"}
        )
    await door.turn(team.supervisor, message, choice="none", priority=told.supervisor_turns)


async def run_worker(door: Door, worker: Worker, retention: str | None, seed: int) -> None:
    """A ReAct loop: a tool call a turn, the tool's result the next turn, then an answer."""
    await door.make(worker.agent_id, retention)
    chance = random.Random(f"{seed}-{worker.agent_id}")
    message: Message = {"content": worker.task}
    for tool_s, result_words in worker.tools:
        call_id = await door.turn(worker.agent_id, message)
        await asyncio.sleep(tool_s)
        result = words(result_words, chance)
        message = (
            {"role": "tool", "tool_call_id": call_id, "content": result}
            if call_id
            else {"content": f"Call one of the tools. Earlier: {result}"}
        )
    await door.turn(worker.agent_id, message, choice="none")


def counters(url: str) -> dict[str, float]:
    """semantic's prompt-token counters (tokens received, restored from each tier, blocks
    cut from disk); none from a server that keeps no such counters."""
    text = httpx.get(f"{url}/metrics").text
    wanted = {
        "prompt": r"^semantic_prompt_tokens_total (\S+)",
        "memory": r'^semantic_restored_tokens_total\{tier="memory"\} (\S+)',
        "disk": r'^semantic_restored_tokens_total\{tier="disk"\} (\S+)',
        "cut": r"^semantic_blocks_evicted_from_disk(?:_total)? (\S+)",
    }
    return {k: float(m.group(1)) for k, p in wanted.items() if (m := re.search(p, text, re.M))}


@dataclass(frozen=True)
class Ran:
    seen: Seen
    total_s: float
    counted: dict[str, float]
    """The server's counters over the trace (after less before)."""


async def run_trace(url: str, teams: list[Team], told: Hints, seed: int, model: str) -> Ran:
    """The trace through semantic's agents API, or (``model`` given) through chat
    completions. First one turn of an agent outside the trace, before the clock starts:
    the shared system prompt with the tools is then cached, as on a server that has seen
    traffic, so no run is charged for the first prefill of it."""
    seen = Seen()
    limits = httpx.Limits(max_connections=2 * len(teams) * len(teams[0].waves[0]) + 2)
    async with httpx.AsyncClient(base_url=url, timeout=1200, limits=limits) as client:
        door: Door = (
            ChatDoor(client, RULES, TOOLS, seen, model)
            if model
            else AgentsDoor(client, RULES, TOOLS, seen)
        )
        await door.make("warm-up", None)
        await door.turn("warm-up", {"content": "Say hello."})
        seen.turns.clear()
        before = await asyncio.to_thread(counters, url)
        started = time.perf_counter()
        await asyncio.gather(*(run_team(door, team, told, seed) for team in teams))
        total_s = time.perf_counter() - started
    after = await asyncio.to_thread(counters, url)
    return Ran(seen, total_s, {k: v - before.get(k, 0.0) for k, v in after.items()})


def report(name: str, ran: Ran) -> None:
    counted, turns = ran.counted, ran.seen.turns
    prompt = counted.get("prompt")

    def share(tier: str) -> str:
        return f"{counted.get(tier, 0) / prompt:6.1%}" if prompt else "     -"

    def ms(values: list[float], q: float) -> str:
        return f"{quantile(values, q) * 1e3:7.0f}" if values else "      -"

    ttft, step = [t.ttft_s for t in turns], [t.step_s for t in turns]
    cut = f"{counted['cut']:5.0f}" if "cut" in counted else "    -"
    print(
        f"{name:<22} {share('memory')} {share('disk')} {cut}  ttft p50 {ms(ttft, 0.5)} p99 "
        f"{ms(ttft, 0.99)}  step p50 {ms(step, 0.5)} p99 {ms(step, 0.99)}"
        f"  total {ran.total_s:6.1f} s  ({len(turns)} turns, {ran.seen.failures} failed)",
        flush=True,
    )
    slowest = sorted(turns, key=lambda t: t.ttft_s, reverse=True)[:5]
    print(
        f"{'':<22} slowest first tokens (agent ms computed/prompt tokens): "
        + ", ".join(
            f"{t.agent_id} {t.ttft_s * 1e3:.0f} {t.computed}/{t.prompt_tokens}" for t in slowest
        ),
        flush=True,
    )


def paths(teams: list[Team], ran: Ran) -> None:
    """Where each team's time went: when its last turn ended, its supervisor's turns (sent
    to last token), and its tools' floor (each wave's longest chain of tool waits)."""
    turns = ran.seen.turns
    if not turns:
        return
    began = min(t.sent_at for t in turns)
    said = []
    for team in teams:
        ids = {team.supervisor, *(w.agent_id for wave in team.waves for w in wave)}
        own = [t for t in turns if t.agent_id in ids]
        ended = max(t.sent_at + t.ttft_s + t.step_s for t in own) - began
        supervised = sum(t.ttft_s + t.step_s for t in own if t.agent_id == team.supervisor)
        tools = sum(max(sum(s for s, _ in w.tools) for w in wave) for wave in team.waves)
        said.append(
            f"{team.supervisor} {ended:.0f} s ({supervised:.0f} its turns, {tools:.0f} tools)"
        )
    print(f"{'':<22} teams ended: " + ", ".join(said), flush=True)


def keep_turns(path: Path | None, name: str, seen: Seen) -> None:
    if path is not None:
        with path.open("a") as out:
            out.writelines(
                json.dumps({"run": name, **dataclasses.asdict(t)}) + "\n" for t in seen.turns
            )


def arguments() -> argparse.Namespace:
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
    parser.add_argument(
        "--urgent-supervisors",
        action="store_true",
        help="two more runs, each policy with every supervisor's turn sent `X-Priority: "
        "high` (it goes first, unpaced: ADR 0009)",
    )
    parser.add_argument(
        "--mlx-lm",
        type=Path,
        metavar="MODEL_DIR",
        help="also replay the trace on mlx_lm.server over this model directory, through chat "
        "completions, its prompt cache held to the memory budget",
    )
    return parser.parse_args()


def main() -> None:
    args = arguments()
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
    runs = [
        ("lru", "--eviction lru", Hints(None, None)),
        ("agent policy + hints", "--eviction agent", hints(args.max_tool_s)),
    ]
    if args.urgent_supervisors:
        runs += [
            ("agent + X-Priority", "--eviction agent", hints(args.max_tool_s, urgent=True)),
            ("lru + X-Priority", "--eviction lru", Hints(None, None, "high")),
        ]
    with tempfile.TemporaryDirectory() as tmp:
        for n, (name, flag, told) in enumerate(runs):
            data = Path(tmp) / f"run-{n}"  # each on a fresh server and data directory
            args_ = ("--kv-budget-mb", str(budget), "--disk-quota-mb", str(disk), *flag.split())
            with steady_server(data, *args_).start() as server:
                ran = asyncio.run(run_trace(server.url, teams, told, args.seed, ""))
                report(name, ran)
                paths(teams, ran)
                keep_turns(args.turns_out, name, ran.seen)
                server.stop()
    if args.mlx_lm:
        replay_on_mlx_lm(args.mlx_lm, teams, args.seed, budget, args.turns_out)


def replay_on_mlx_lm(
    model_dir: Path, teams: list[Team], seed: int, budget_mb: int, turns_out: Path | None
) -> None:
    """The same trace on mlx_lm.server: every turn sends the agent's whole history (its
    server keeps none), and its prompt cache may hold ``budget_mb`` (it has no disk tier)."""
    with tempfile.TemporaryDirectory() as tmp:
        theirs = MlxLmServer(
            model_dir, Path(tmp) / "mlx_lm.log", "--prompt-cache-bytes", str(budget_mb << 20)
        )
        try:
            ran = asyncio.run(run_trace(theirs.url, teams, Hints(None, None), seed, theirs.model))
            report("mlx_lm.server", ran)
            keep_turns(turns_out, "mlx_lm.server", ran.seen)
        finally:
            theirs.stop()


if __name__ == "__main__":
    main()
