"""Slow clients: thousands of sockets that begin a request and never finish it.

    python -m reliability.slow_clients [--sockets 3000] [--seconds 40]

Bounded and self-stopping, all on 127.0.0.1. The server starts with a descriptor limit
below the flood (soft 1,024, hard 2,048, as in issue 32, where 2,300 such sockets held a
server at its limit: nothing else connected, a KV save failed with EMFILE and the log grew
128 MB in 40 s). Most sockets send a request line and stop in the headers; a few send whole
headers and stop in the body. Whenever the server closes one, it is opened again, so the
pressure lasts the whole run. Meanwhile an ordinary client asks ``/health`` and a short chat
completion, one after another, each with a 2-second timeout. Reported: how those requests
fared, how the flood's sockets ended (408, 503, closed), the longest a slow socket was held,
the server's peak descriptors, its log size and how often it said "Too many open files".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai

from reliability.server import ServerProcess

SERVER_DESCRIPTORS = (1024, 2048)
"""The server's RLIMIT_NOFILE at its start (soft, hard): below the flood, as in the issue."""
ORDINARY_TIMEOUT_S = 2.0
BODY_EVERY = 20
"""One socket in this many stops in the body rather than in the headers."""
HEADERS = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slow\r\n"
BODY = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b'Content-Type: application/json\r\nContent-Length: 4096\r\n\r\n{"model": '
)


@dataclass
class SlowClientResult:
    sockets: int = 0
    seconds: float = 0.0
    connections: int = 0
    """Connections the flood opened, reopenings included."""
    answered: dict[str, int] = field(default_factory=dict)
    """How the flood's connections ended: the server's status line, "closed" (with no
    answer), "reset", or "open at the end" of the run."""
    connect_failures: int = 0
    longest_held_s: dict[str, float] = field(default_factory=dict)
    """The longest the server kept a slow socket open, by where it stopped (those open at
    the end of the run included)."""
    ordinary_s: list[float] = field(default_factory=list)
    health_s: list[float] = field(default_factory=list)
    before_s: list[float] = field(default_factory=list)
    """The same ordinary requests before the flood: what this machine gives without it."""
    connect_errors: dict[str, int] = field(default_factory=dict)
    all_open_after_s: float = 0.0
    """How long the flood took to open its sockets once each; ordinary requests start then."""
    during_flood: int = 0
    """Ordinary requests made while the flood ran (the rest came after it)."""
    server_cpu_s: float = 0.0
    """CPU time the server spent during the flood."""
    ordinary_failures: list[str] = field(default_factory=list)
    peak_server_descriptors: int = 0
    log_bytes: int = 0
    too_many_open_files: int = 0
    descriptor_limit_line: str = ""
    descriptor_limit_serving: int = 0
    """The server's soft RLIMIT_NOFILE once it serves (after the model code has loaded)."""
    failures: list[str] = field(default_factory=list)


class Flood:
    """``sockets`` slow clients on an event loop of their own, for ``seconds``."""

    def __init__(self, port: int, sockets: int, seconds: float) -> None:
        self.port = port
        self.sockets = sockets
        self.seconds = seconds
        self.result = SlowClientResult(sockets=sockets)
        self.opened = threading.Event()

    def run(self) -> None:
        asyncio.run(self._flood())

    async def _flood(self) -> None:
        deadline = time.monotonic() + self.seconds
        await asyncio.gather(*(self._client(i, deadline) for i in range(self.sockets)))

    async def _client(self, index: int, deadline: float) -> None:
        kind, sent = ("body", BODY) if index % BODY_EVERY == 0 else ("headers", HEADERS)
        while (left := deadline - time.monotonic()) > 0:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", self.port), left
                )
            except TimeoutError:
                return  # still connecting when the run ended
            except OSError as error:
                self.result.connect_failures += 1
                name = type(error).__name__
                self.result.connect_errors[name] = self.result.connect_errors.get(name, 0) + 1
                await asyncio.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
                continue
            self.result.connections += 1
            if self.result.connections >= self.sockets:
                self.opened.set()
            started = time.monotonic()
            try:
                writer.write(sent)
                answer = await asyncio.wait_for(reader.read(64), deadline - time.monotonic())
            except TimeoutError:
                answer = None  # the run ended with this one still held
            except OSError:
                answer = b"reset"
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
            self._ended(kind, answer, time.monotonic() - started)

    def _ended(self, kind: str, answer: bytes | None, held_s: float) -> None:
        """How one slow connection ended; ``None``: still open when the run ended."""
        how = (
            "open at the end"
            if answer is None
            else "closed"
            if not answer
            else "reset"
            if answer == b"reset"
            else answer[9:12].decode()
        )
        self.result.answered[how] = self.result.answered.get(how, 0) + 1
        longest = self.result.longest_held_s
        longest[kind] = max(longest.get(kind, 0.0), held_s)


def ask_ordinary(server: ServerProcess, result: SlowClientResult) -> None:
    """``/health`` and a short chat completion, each timed against the 2-second bound, each
    from a client arriving now (a connection of its own, as a new caller has). A pooled
    connection left idle between requests is itself a connection that sends no request:
    the server may close it to make room, and the SDK's retry would then hide the case."""
    started = time.monotonic()
    try:
        health = httpx.get(f"{server.url}/health", timeout=ORDINARY_TIMEOUT_S)
        if health.status_code != 200:
            result.ordinary_failures.append(f"/health: {health.status_code}")
    except httpx.HTTPError as error:
        result.ordinary_failures.append(f"/health: {type(error).__name__} {error}")
    result.health_s.append(time.monotonic() - started)
    result.ordinary_s.append(result.health_s[-1])
    started = time.monotonic()
    client = openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="unused", timeout=ORDINARY_TIMEOUT_S, max_retries=0
    )
    try:
        client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "Say hi."}],
            max_tokens=1,
            temperature=0,
        )
    except openai.APIError as error:
        result.ordinary_failures.append(f"chat: {type(error).__name__} {error}")
    finally:
        client.close()
    result.ordinary_s.append(time.monotonic() - started)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_files_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    return 0


def descriptors(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def run(
    sockets: int,
    seconds: float,
    workdir: Path,
    *,
    header_timeout_s: float = 10.0,
    body_timeout_s: float = 30.0,
    before_rounds: int = 4,
) -> SlowClientResult:
    _raise_own_descriptor_limit(sockets)
    server = ServerProcess(
        workdir / "slow-clients",
        "--header-timeout",
        str(header_timeout_s),
        "--body-timeout",
        str(body_timeout_s),
        nofile=SERVER_DESCRIPTORS,
    ).start()
    assert server.process is not None
    flood = Flood(server.port, sockets, seconds)
    result = flood.result
    try:
        ask_ordinary(server, SlowClientResult())  # warm: the first request compiles
        before = SlowClientResult()
        for _ in range(before_rounds):
            ask_ordinary(server, before)
        result.before_s = before.ordinary_s
        result.descriptor_limit_serving = open_files_limit(server.process.pid)
        thread = threading.Thread(target=flood.run, name="slow-clients")
        cpu_before = cpu_seconds(server.process.pid)
        started = time.monotonic()
        thread.start()
        flood.opened.wait(seconds)  # the ordinary client asks once the flood is all in
        result.all_open_after_s = time.monotonic() - started
        while thread.is_alive():
            ask_ordinary(server, result)
            result.during_flood = len(result.ordinary_s)
            result.peak_server_descriptors = max(
                result.peak_server_descriptors, descriptors(server.process.pid)
            )
            thread.join(0.2)
        result.seconds = time.monotonic() - started
        result.server_cpu_s = cpu_seconds(server.process.pid) - cpu_before
        ask_ordinary(server, result)  # and once it is over
    finally:
        server.kill()
    _read_log(server.log, result)
    _judge(result)
    return result


def _read_log(log: Path, result: SlowClientResult) -> None:
    result.log_bytes = log.stat().st_size
    text = log.read_text(errors="replace")
    result.too_many_open_files = text.count("Too many open files")
    for line in text.splitlines():
        if "descriptor limit" in line:
            result.descriptor_limit_line = line.split(": ", 1)[-1]
            break


def _judge(result: SlowClientResult) -> None:
    if not result.ordinary_s:
        result.failures.append("no ordinary request was made during the flood")
    result.failures += [f"ordinary request failed: {what}" for what in result.ordinary_failures]
    slow = [s for s in result.ordinary_s if s > ORDINARY_TIMEOUT_S]
    if slow:
        result.failures.append(f"{len(slow)} ordinary requests took over 2 s: {max(slow):.1f} s")
    if result.log_bytes >= 1 << 20:
        result.failures.append(f"the server's log grew to {result.log_bytes} bytes")
    if result.too_many_open_files:
        result.failures.append(f"'Too many open files' {result.too_many_open_files} times")


def _raise_own_descriptor_limit(sockets: int) -> None:
    """The flood's sockets are this process's descriptors too."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if min(soft, hard) != resource.RLIM_INFINITY and hard < sockets + 256:
        raise RuntimeError(f"this process may open {hard} descriptors: too few for {sockets}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sockets", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=40.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.sockets, args.seconds, Path(tmp))
    for line in summary(result):
        print(line)


def summary(result: SlowClientResult) -> list[str]:
    ordinary = sorted(result.ordinary_s)
    median = _median(ordinary)
    return [
        f"slow sockets: {result.sockets} for {result.seconds:.0f} s, {result.connections} "
        f"connections opened, {result.connect_failures} connect failures "
        f"{dict(sorted(result.connect_errors.items()))}",
        f"server: {result.descriptor_limit_line}; {result.descriptor_limit_serving} while "
        f"serving; peak {result.peak_server_descriptors} open",
        "how the server ended them: "
        + ", ".join(f"{how} {count}" for how, count in sorted(result.answered.items())),
        "longest held: "
        + ", ".join(f"{kind} {s:.1f} s" for kind, s in sorted(result.longest_held_s.items())),
        f"flood all open after {result.all_open_after_s:.1f} s; ordinary requests: "
        f"{result.during_flood} during the flood and {len(ordinary) - result.during_flood} "
        f"after it, median {median:.2f} s, "
        f"slowest {ordinary[-1] if ordinary else 0:.2f} s (/health slowest "
        f"{max(result.health_s, default=0):.2f} s), failed {len(result.ordinary_failures)}",
        f"the same requests before the flood: {len(result.before_s)}, median "
        f"{_median(result.before_s):.2f} s, slowest {max(result.before_s, default=0):.2f} s",
        f"server CPU during the flood: {result.server_cpu_s:.1f} s",
        f"server log: {result.log_bytes} bytes, 'Too many open files' {result.too_many_open_files}"
        " times",
        *(f"  {failure}" for failure in result.failures[:20]),
    ]


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2] if values else 0.0


if __name__ == "__main__":
    main()
