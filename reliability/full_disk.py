"""A full disk costs cached KV, never transcripts or service (issue 32).

    python -m reliability.full_disk [--size-mb 64]

Needs root: each scenario runs a real server with its data directory on a tmpfs of its own.

others: two agents take a ~420-token turn each, then another program fills the disk. Agent
    turns and new agents must keep answering (our blocks give way). Then the other program
    keeps the disk full (it takes whatever is freed), and agents are made and turns sent
    until one is refused: a 507 naming the disk, shown by ``/health`` and the metrics,
    keeping nothing, while plain requests still answer. The other program lets go, and the
    next turn must answer without a restart.
ours: with ``--disk-reserve-mb 20``, two agents (~420 and ~750 tokens) fill the disk with
    their own blocks; every turn answers, also after a restart.
Both: every answered turn is in its transcript, no refused one is, and no partial file is
left behind. Prints turns answered and refused, blocks evicted, free space over time and
the time from space returning to the next answered turn.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from reliability.server import ServerProcess
from reliability.services.haproxy import HAProxyServer

LONG = " ".join(f"item{i} is a thing that matters," for i in range(44))
"""With its question, a turn of ~420 tokens: one whole block and a partial one."""
LONGER = " ".join(f"item{i} is a thing that matters," for i in range(78))
"""~750 tokens: two whole blocks and a partial one."""
RULES = "Rules: be brief, be kind, be exact. " * 400
"""A system prompt of ~14 KB that still fits the context: agents made with it fill the
database quickly."""
MAX_CREATES = 400
MAX_REFUSAL_TURNS = 8
ROTATION_LIMIT_S = 15.0
"""HAProxy checks /ready every second and acts on two answers alike: a few seconds at most."""


class MountRefusedError(RuntimeError):
    """The tmpfs could not be mounted (not root, or no mount in this container)."""


@dataclass
class Result:
    turns_answered: int = 0
    turns_refused: int = 0
    agents_created: int = 0
    blocks_evicted: int = 0
    free_mb: list[tuple[str, float]] = field(default_factory=list)
    refusal: str = ""
    recovery_s: float | None = None
    out_of_rotation_s: float | None = None
    """From the refusal to the router sending the instance nothing (its /ready says 503)."""
    back_in_rotation_s: float | None = None
    """From space returning to the router sending it requests again."""
    failures: list[str] = field(default_factory=list)


@contextlib.contextmanager
def tmpfs(path: Path, size_mb: int) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    command = ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as error:  # no mount command at all
        raise MountRefusedError(str(error)) from error
    if done.returncode != 0:
        raise MountRefusedError(done.stderr.strip() or f"mount exited with {done.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path) -> int:
    """Another program: append zeros to ``path`` until the disk has no room; bytes added."""
    written = 0
    with open(path, "ab", buffering=0) as handle:
        for size in (1 << 20, 1 << 12, 1 << 9):
            chunk = bytes(size)
            while True:
                try:
                    written += handle.write(chunk) or 0
                except OSError as error:
                    if error.errno != errno.ENOSPC:
                        raise
                    break
    return written


class Squatter:
    """Another program that keeps the disk full: it takes whatever is freed, at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Squatter:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            fill(self.path)
            self._stop.wait(0.002)


class Agents:
    """The agents API over HTTP, and what each agent's transcript must hold; ``router``:
    HAProxy's address in front of the server, with the shipped configuration."""

    def __init__(self, server: ServerProcess, result: Result, router: str = "") -> None:
        self.server = server
        self.router = router
        self.http = httpx.Client(base_url=server.url, timeout=600)
        self.result = result
        self.kept: dict[str, list[tuple[str, str]]] = {}

    def create(self, agent: str, system: str | None = None) -> httpx.Response:
        response = self.http.post("/v1/agents", json={"id": agent, "system_prompt": system})
        if response.status_code == 201:
            self.kept[agent] = []
            self.result.agents_created += 1
        return response

    def turn(self, agent: str, content: str) -> httpx.Response:
        body = {"content": content, "max_tokens": 4, "temperature": 0}
        response = self.http.post(f"/v1/agents/{agent}/messages", json=body)
        if response.status_code == 200:
            self.kept[agent] += [("user", content), ("assistant", response.json()["content"])]
            self.result.turns_answered += 1
        elif response.status_code == 507:
            self.result.turns_refused += 1
        return response

    def must(self, response: httpx.Response, status: int, what: str) -> None:
        if response.status_code != status:
            self.result.failures.append(f"{what}: {response.status_code} {response.text[:300]}")

    def check_transcripts(self, when: str) -> None:
        for agent, kept in self.kept.items():
            page = self.http.get(f"/v1/agents/{agent}/messages", params={"limit": 1000}).json()
            stored = [(m["role"], m["content"]) for m in page["data"]]
            if stored != kept:
                self.result.failures.append(
                    f"{when}: {agent}'s transcript holds {len(stored)} messages, "
                    f"{len(kept)} were answered"
                )

    def health(self) -> dict[str, Any]:
        body: dict[str, Any] = self.http.get("/health").json()
        return body

    def ready(self) -> httpx.Response:
        return self.http.get("/ready")

    def seconds_until_routed(self, wanted: bool) -> float | None:
        """How long until the router sends the instance requests (``wanted``) or none."""
        started = time.monotonic()
        while time.monotonic() - started < ROTATION_LIMIT_S:
            answer = httpx.get(f"{self.router}/v1/models", timeout=10)
            if ("X-Semantic-Instance" in answer.headers) == wanted:
                return time.monotonic() - started
            time.sleep(0.1)
        return None

    def plain(self) -> httpx.Response:
        body = {"model": "default", "messages": [{"role": "user", "content": "Hi."}]}
        return self.http.post("/v1/chat/completions", json={**body, "max_tokens": 2})


def free_mb(disk: Path) -> float:
    import shutil

    return shutil.disk_usage(disk).free / (1 << 20)


def partial_files(disk: Path, result: Result, when: str) -> None:
    stray = [p.name for p in disk.rglob("*.tmp")]
    if stray:
        result.failures.append(f"{when}: partial files left: {stray[:5]}")


def others(workdir: Path, size_mb: int, result: Result) -> None:
    """The disk filled by another program."""
    with tmpfs(workdir / "others", size_mb) as disk:
        server = ServerProcess(disk / "data", log=workdir / "others.log").start()
        router = HAProxyServer(workdir / "router", [f"127.0.0.1:{server.port}"])
        with server, router.start():
            agents = Agents(server, result, router.url)
            _others_fill(disk, agents)
            _others_refuse(disk, agents)
            _others_recover(disk, agents)
            partial_files(disk, result, "others")
            result.blocks_evicted += int(server.metric("semantic_blocks_evicted_from_disk_total"))
            if server.stop() != 0:
                result.failures.append("others: the server did not exit cleanly")


def _others_fill(disk: Path, agents: Agents) -> None:
    """Two agents' turns, then a disk another program fills: turns and new agents answer."""
    for agent in ("a", "b"):
        agents.must(agents.create(agent), 201, f"create {agent}")
        agents.must(agents.turn(agent, f"Agent {agent}. {LONG} Summarise."), 200, f"{agent}: 1")
    agents.result.free_mb.append(("others: two agents' turns", free_mb(disk)))
    fill(disk / "other-program")
    agents.result.free_mb.append(("others: filled by another program", free_mb(disk)))
    agents.must(agents.turn("a", "Name a fruit."), 200, "a's turn on the full disk")
    agents.must(agents.create("c"), 201, "an agent made on the full disk")
    agents.must(agents.turn("b", "Name a river."), 200, "b's turn on the full disk")
    agents.must(agents.turn("c", "Name a tree."), 200, "c's turn on the full disk")
    agents.result.free_mb.append(("others: after three turns on it", free_mb(disk)))
    agents.check_transcripts("others, full disk")
    partial_files(disk, agents.result, "others, full disk")


def _others_refuse(disk: Path, agents: Agents) -> None:
    """The disk kept full by another program: agents and turns go on until nothing of ours
    is left, then a turn is refused, clearly, and keeps nothing."""
    with Squatter(disk / "squatter"):
        refused = None
        for index in range(MAX_CREATES):
            response = agents.create(f"x{index}", RULES)
            if response.status_code != 201:
                refused = response
                break
        for index in range(MAX_REFUSAL_TURNS):
            response = agents.turn("a", f"Question {index}: name a colour.")
            if response.status_code != 200:
                refused = response
                break
        agents.result.free_mb.append(("others: kept full by another program", free_mb(disk)))
        if refused is None or refused.status_code != 507:
            what = "none" if refused is None else f"{refused.status_code} {refused.text[:200]}"
            agents.result.failures.append(f"no 507 while the disk was full of others: {what}")
            return
        _check_refusal(disk, agents, refused)


def _check_refusal(disk: Path, agents: Agents, refused: httpx.Response) -> None:
    result = agents.result
    message = refused.json()["error"]["message"]
    result.refusal = message
    if str(disk) not in message:
        result.failures.append(f"the 507 does not name the disk: {message}")
    health = agents.health()
    if health.get("status") != "degraded" or str(disk) not in health.get("storage", ""):
        result.failures.append(f"/health does not show the full disk: {health}")
    if agents.server.metric("semantic_disk_full") != 1:
        result.failures.append("semantic_disk_full is not 1 while turns are refused")
    agents.must(agents.plain(), 200, "a plain request on the full disk")
    agents.check_transcripts("others, refused")
    _check_out_of_rotation(disk, agents)


def _check_out_of_rotation(disk: Path, agents: Agents) -> None:
    """/ready says why turns fail here, and the router stops sending the instance anything
    (its own 503, with Retry-After, while no instance is ready)."""
    result = agents.result
    ready = agents.ready()
    reasons = " ".join(ready.json().get("reasons", []))
    if ready.status_code != 503 or str(disk) not in reasons:
        result.failures.append(f"/ready on the full disk: {ready.status_code} {ready.text[:200]}")
    result.out_of_rotation_s = agents.seconds_until_routed(False)
    if result.out_of_rotation_s is None:
        result.failures.append("the router kept sending requests to the full-disk instance")
        return
    answer = httpx.get(f"{agents.router}/v1/models", timeout=10)
    if answer.status_code != 503 or "Retry-After" not in answer.headers:
        result.failures.append(f"the router without an instance: {answer.status_code}")


def _others_recover(disk: Path, agents: Agents) -> None:
    """The other program lets go: the next turn answers, without a restart."""
    for path in disk.glob("other-program"):
        path.unlink()
    (disk / "squatter").unlink(missing_ok=True)
    agents.result.free_mb.append(("others: space returned", free_mb(disk)))
    agents.result.back_in_rotation_s = agents.seconds_until_routed(True)
    if agents.result.back_in_rotation_s is None:
        agents.result.failures.append("the router did not take the instance back")
    agents.must(agents.ready(), 200, "/ready once space returned")
    started = time.monotonic()
    response = agents.turn("a", "Are you back?")
    agents.must(response, 200, "a's turn once space returned, without a restart")
    if response.status_code == 200:
        agents.result.recovery_s = time.monotonic() - started
    health = agents.health()
    if health.get("status") != "ok":
        agents.result.failures.append(f"/health after space returned: {health}")
    if agents.server.metric("semantic_disk_full") != 0:
        agents.result.failures.append("semantic_disk_full is still 1 after space returned")
    agents.check_transcripts("others, recovered")


def ours(workdir: Path, size_mb: int, result: Result) -> None:
    """The disk filled by the server's own blocks, beyond a 20 MiB reserve."""
    with tmpfs(workdir / "ours", size_mb) as disk:
        data, flags = disk / "data", ("--disk-reserve-mb", "20")
        kept: dict[str, list[tuple[str, str]]] = {}
        with ServerProcess(data, *flags, log=workdir / "ours.log").start() as server:
            agents = Agents(server, result)
            agents.must(agents.create("x"), 201, "create x")
            agents.must(agents.create("y"), 201, "create y")
            turns = [("x", f"Agent x. {LONG} Summarise."), ("y", f"Agent y. {LONGER} Sum up.")]
            turns += [("x", "Name a fruit."), ("y", "Name a river."), ("x", "Name a tree.")]
            _turns(disk, agents, turns, "ours")
            kept = agents.kept
            result.blocks_evicted += int(server.metric("semantic_blocks_evicted_from_disk_total"))
            if server.stop() != 0:
                result.failures.append("ours: the server did not exit cleanly")
        with ServerProcess(data, *flags, log=workdir / "ours.log").start() as server:
            agents = Agents(server, result)
            agents.kept = kept
            _turns(disk, agents, [("x", "And a city?"), ("y", "And a colour?")], "restarted")
            result.blocks_evicted += int(server.metric("semantic_blocks_evicted_from_disk_total"))
            server.stop()
        partial_files(disk, result, "ours")


def _turns(disk: Path, agents: Agents, turns: list[tuple[str, str]], when: str) -> None:
    for agent, content in turns:
        agents.must(agents.turn(agent, content), 200, f"{when}: {agent}'s turn")
        agents.result.free_mb.append((f"{when}: after {agent}'s turn", free_mb(disk)))
    agents.check_transcripts(when)


def run(workdir: Path, size_mb: int = 64) -> Result:
    """Both scenarios; raises ``MountRefusedError`` where no tmpfs can be mounted."""
    result = Result()
    others(workdir, size_mb, result)
    ours(workdir, size_mb, result)
    return result


def report(result: Result) -> None:
    print(f"turns answered: {result.turns_answered}, refused (507): {result.turns_refused}")
    print(f"agents created: {result.agents_created}, blocks evicted: {result.blocks_evicted}")
    for label, value in result.free_mb:
        print(f"  free {value:6.1f} MiB  {label}")
    recovery = "never" if result.recovery_s is None else f"{result.recovery_s:.2f} s"
    print(f"from space returning to the next answered turn: {recovery}")
    print(f"the refusal said: {result.refusal}")
    print(
        f"out of the router's rotation {_seconds(result.out_of_rotation_s)} after the refusal, "
        f"back {_seconds(result.back_in_rotation_s)} after space returned"
    )
    print(f"failures: {len(result.failures)}")
    for failure in result.failures[:20]:
        print("  " + failure)


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report(run(Path(tmp), args.size_mb))


if __name__ == "__main__":
    main()
