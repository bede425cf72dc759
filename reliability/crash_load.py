"""Crash under load: kill -9 the server while stateful agents converse, again and again.

    python -m reliability.crash_load [--kills 20] [--agents 6]

After each kill the server restarts on the same data directory (a stray temporary block
file is planted first and must be gone). Every reply that was acknowledged must be in its
agent's transcript, and each agent's next reply must equal a cold run of the same
conversation: its cache restored exactly, or recomputed.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from reliability.server import ServerProcess

SYSTEM = "Answer in a few words."
QUESTIONS = ("Name a planet.", "Name a metal.", "Name a bird.", "Name a sport.", "Name a tool.")


@dataclass
class CrashResult:
    kills: int = 0
    survived: int = 0
    acknowledged: int = 0
    checked: int = 0
    failures: list[str] = field(default_factory=list)


def agent_loop(url: str, agent: str, stop: threading.Event, acked: dict[str, list[str]]) -> None:
    rng = random.Random(agent)
    with httpx.Client(base_url=url, timeout=600) as client:
        while not stop.is_set():
            try:
                reply = client.post(
                    f"/v1/agents/{agent}/messages",
                    json={"content": rng.choice(QUESTIONS), "max_tokens": 12},
                )
            except httpx.HTTPError:
                return
            if reply.status_code == 200:
                acked[agent].append(reply.json()["content"])


def check_agent(
    server: ServerProcess, agent: str, replies: list[str], trial: int, result: CrashResult
) -> bool:
    transcript = httpx.get(f"{server.url}/v1/agents/{agent}/messages").json()["data"]
    assistant = [m["content"] for m in transcript if m["role"] == "assistant"]
    if assistant[: len(replies)] != replies:
        result.failures.append(
            f"trial {trial} {agent}: acknowledged replies missing from the transcript"
        )
        return False
    question = "One more, please."
    warm = httpx.post(
        f"{server.url}/v1/agents/{agent}/messages",
        json={"content": question, "max_tokens": 12},
        timeout=600,
    ).json()
    messages = [{"role": "system", "content": SYSTEM}]
    messages += [{"role": m["role"], "content": m["content"]} for m in transcript]
    messages.append({"role": "user", "content": question})
    cold = httpx.post(
        f"{server.url}/v1/chat/completions",
        timeout=600,
        headers={"X-Namespace": f"cold-{trial}"},
        json={"model": "default", "messages": messages, "temperature": 0, "max_tokens": 12},
    ).json()
    result.checked += 1
    if warm["content"] != cold["choices"][0]["message"]["content"]:
        result.failures.append(f"trial {trial} {agent}: the next reply differs from a cold run")
        return False
    return True


def run(kills: int, agents: int, workdir: Path, seed: int = 5) -> CrashResult:
    rng = random.Random(seed)
    result = CrashResult()
    data_dir = workdir / "data"
    server = ServerProcess(data_dir).start()
    names = [f"agent-{i}" for i in range(agents)]
    for name in names:
        httpx.post(f"{server.url}/v1/agents", json={"id": name, "system_prompt": SYSTEM})
    for trial in range(kills):
        acked: dict[str, list[str]] = {
            name: [
                m["content"]
                for m in httpx.get(f"{server.url}/v1/agents/{name}/messages").json()["data"]
                if m["role"] == "assistant"
            ]
            for name in names
        }
        before = sum(len(v) for v in acked.values())
        stop = threading.Event()
        threads = [
            threading.Thread(target=agent_loop, args=(server.url, n, stop, acked)) for n in names
        ]
        server.kill_during(threads, stop, rng.uniform(1.0, 6.0))
        result.kills += 1
        result.acknowledged += sum(len(v) for v in acked.values()) - before
        stray = data_dir / "blocks" / "zz" / "planted.safetensors.1.tmp"
        stray.parent.mkdir(parents=True, exist_ok=True)
        stray.write_bytes(b"half-written")
        server = ServerProcess(data_dir).start()
        ok = not stray.exists()
        if not ok:
            result.failures.append(f"trial {trial}: a stray temporary file survived the restart")
        for name in names:
            ok &= check_agent(server, name, acked[name], trial, result)
        result.survived += ok
    server.kill()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--agents", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.kills, args.agents, Path(tmp))
    print(
        f"crash trials survived: {result.survived} of {result.kills}; replies acknowledged "
        f"before kills: {result.acknowledged}; agents checked after restarts: {result.checked}"
    )
    for failure in result.failures[:20]:
        print("  " + failure)


if __name__ == "__main__":
    main()
