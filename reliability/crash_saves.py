"""Kill -9 the server at random moments while agents converse, restart, and check memory.

    python -m reliability.crash_saves [--trials 50] [--agents 3] [--seed 1]

Each trial: start a server on one data directory, let agents converse (every reply is only
acknowledged once its KV and blocks are on disk), kill -9 at a random moment after the
first acknowledged reply (so a slow machine still has something to check), restart, and
for every agent whose turn was acknowledged check that its next turn reports at least that
conversation as cached and answers exactly as a cold run does; then check that no metadata
row points at a missing or corrupt block file.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from reliability.integrity import block_problems
from reliability.server import ServerProcess
from reliability.trials import each_trial, print_failures

QUESTIONS = ("Name a fruit.", "Name a river.", "Name a colour.", "Name a city.", "Name a tree.")


@dataclass
class Conversation:
    agent: str
    messages: list[dict[str, str]] = field(default_factory=list)
    acknowledged_tokens: int = 0


@dataclass
class Summary:
    trials: int = 0
    survived: int = 0
    acknowledged_turns: int = 0
    checked_agents: int = 0
    failures: list[str] = field(default_factory=list)


def chat(url: str, messages: list[dict[str, str]], headers: dict[str, str]) -> dict[str, object]:
    body = {"model": "default", "messages": messages, "temperature": 0, "max_tokens": 12}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120)
    response.raise_for_status()
    result: dict[str, object] = response.json()
    return result


def converse(
    url: str,
    conversation: Conversation,
    rng: random.Random,
    stop: threading.Event,
    acked: threading.Event,
) -> None:
    while not stop.is_set():
        conversation.messages.append({"role": "user", "content": rng.choice(QUESTIONS)})
        try:
            reply = chat(url, conversation.messages, {"X-Agent-Id": conversation.agent})
        except httpx.HTTPError:
            conversation.messages.pop()
            return
        usage = reply["usage"]
        content = reply["choices"][0]["message"]["content"]  # type: ignore[index]
        conversation.messages.append({"role": "assistant", "content": content})
        conversation.acknowledged_tokens = usage["prompt_tokens"] + usage["completion_tokens"]  # type: ignore[index]
        acked.set()


def trial(data_dir: Path, index: int, agents: int, rng: random.Random, summary: Summary) -> None:
    conversations = [Conversation(f"agent-{index}-{a}") for a in range(agents)]
    with ServerProcess(data_dir).start() as server:
        stop, acked = threading.Event(), threading.Event()
        threads = [
            threading.Thread(
                target=converse, args=(server.url, c, random.Random(rng.random()), stop, acked)
            )
            for c in conversations
        ]
        server.kill_during(threads, stop, rng.uniform(0.5, 4.0), acked)
    summary.trials += 1
    with ServerProcess(data_dir).start() as server:
        checked = [check(server.url, index, c, summary) for c in conversations]
    ok = all(checked)
    problems = block_problems(data_dir)
    if problems:
        ok = False
        summary.failures += [f"trial {index}: {p}" for p in problems]
    summary.survived += ok


def check(url: str, index: int, conversation: Conversation, summary: Summary) -> bool:
    """After the restart: the acknowledged prefix is cached and the reply equals a cold one."""
    acked = list(conversation.messages)
    if conversation.acknowledged_tokens == 0:
        return True
    if acked and acked[-1]["role"] == "user":
        acked.pop()  # the turn in flight when the kill came was never acknowledged
    summary.acknowledged_turns += sum(1 for m in acked if m["role"] == "assistant")
    follow = [*acked, {"role": "user", "content": "Thanks. One more, please."}]
    warm = chat(url, follow, {"X-Agent-Id": conversation.agent})
    cold = chat(url, follow, {"X-Namespace": f"cold-{index}"})
    cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]  # type: ignore[index]
    summary.checked_agents += 1
    ok = True
    if cached < conversation.acknowledged_tokens - 1:
        ok = False
        summary.failures.append(
            f"trial {index} {conversation.agent}: cached {cached} < "
            f"acknowledged {conversation.acknowledged_tokens}"
        )
    if warm["choices"] != cold["choices"]:
        ok = False
        summary.failures.append(f"trial {index} {conversation.agent}: warm reply != cold")
    return ok


def run(trials: int, agents: int = 3, seed: int = 1, workdir: Path | None = None) -> Summary:
    summary = Summary()
    each_trial(trials, seed, workdir, lambda d, i, rng: trial(d, i, agents, rng, summary))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    started = time.monotonic()
    summary = run(args.trials, args.agents, args.seed)
    print(f"crash trials: {summary.trials}, survived: {summary.survived}")
    print(
        f"acknowledged turns before kills: {summary.acknowledged_turns}, "
        f"agents checked after restart: {summary.checked_agents}"
    )
    print_failures(summary.failures)
    print(f"took {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
