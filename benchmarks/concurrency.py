"""Concurrency through HTTP: N agents streaming at once, ours and mlx-lm's own server.

After one short warm-up stream, for each N: N distinct short chats start together, each
streaming a 64-token reply. The full benchmark measures both servers in turn at each N, in
rounds, and keeps each figure's median (``benchmarks.__main__.run_concurrency``).
Reports aggregate tokens/s end to end (prompts' prefill included), the aggregate decode rate
(tokens after each agent's first, over the span from the first first token to the last
token: what the issue's "N agents >= k x one agent's decode rate" compares), and the
p50/p99 of time to first token and inter-token latency.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from reliability.server import free_port

from benchmarks.common import chat_chunks, content_of, quantile

TOPICS = (
    "a lighthouse",
    "a bakery",
    "the moon",
    "a forest",
    "a violin",
    "a river",
    "a city",
    "a desert",
    "a train",
    "a garden",
    "the ocean",
    "a mountain",
    "a library",
    "a storm",
    "a museum",
    "a bridge",
)


@dataclass
class ConcurrencyRow:
    server: str
    agents: int
    tokens_per_s: float
    decode_per_s: float
    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float


def one_stream(
    client: httpx.Client, url: str, model: str, prompt: str, *, namespace: str, max_tokens: int
) -> tuple[float, list[float], int]:
    """(time to first token, token arrival times, tokens) for one streaming request."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    started = time.perf_counter()
    arrivals = [
        time.perf_counter()
        for chunk in chat_chunks(client, url, body, namespace)
        if content_of(chunk)
    ]
    return (arrivals[0] - started if arrivals else float("nan")), arrivals, len(arrivals)


def measure(
    url: str,
    name: str,
    agents: int,
    max_tokens: int = 64,
    model: str = "default",
    *,
    round_: int = 0,
) -> ConcurrencyRow:
    """``model`` is what the server expects in the body (mlx_lm.server: the model path; any
    other name sends it looking for a hub); ``round_`` makes the prompts new again from their
    first words, so that a repeat finds no more of them in either server's prompt cache than
    the first round did (the chat template's opening). The requests leave together, as a
    framework's fan-out sends them: each thread waits for the last to start. Started one
    after another, sixteen reached the server over ~90 ms with gaps of 20-30 ms after the
    first few (thread start-up on a 2-core VM), and ours began the round with those few."""
    prompts = [
        (f"Round {round_}. " if round_ else "")
        + f"Write a short story about {TOPICS[i % len(TOPICS)]} (version {i}, set {agents})."
        for i in range(agents)
    ]
    clients = [httpx.Client() for _ in prompts]
    all_started = threading.Barrier(agents)

    def stream(client: httpx.Client, prompt: str) -> tuple[float, list[float], int]:
        all_started.wait()
        return one_stream(client, url, model, prompt, namespace=f"c{agents}", max_tokens=max_tokens)

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=agents) as pool:
        results = list(pool.map(stream, clients, prompts))
    for client in clients:
        client.close()
    ended = max(max(r[1], default=started) for r in results)
    ttfts = [r[0] for r in results]
    gaps = [b - a for r in results for a, b in zip(r[1], r[1][1:], strict=False)]
    tokens = sum(r[2] for r in results)
    if not tokens:
        raise RuntimeError(f"{name} streamed no tokens to {agents} agents")
    return ConcurrencyRow(
        name,
        agents,
        tokens / (ended - started),
        decode_rate([r[1] for r in results]),
        _q(ttfts, 0.5),
        _q(ttfts, 0.99),
        _q(gaps, 0.5),
        _q(gaps, 0.99),
    )


def median_row(rows: Sequence[ConcurrencyRow]) -> ConcurrencyRow:
    """One server's rounds at one agent count, each figure their median."""
    first = rows[0]
    figures = {
        field.name: statistics.median(getattr(r, field.name) for r in rows)
        for field in dataclasses.fields(ConcurrencyRow)
        if field.name not in ("server", "agents")
    }
    return ConcurrencyRow(first.server, first.agents, **figures)


def warm_up(url: str, model: str = "default") -> None:
    """One short stream before the measured ones, to each server alike, so that no
    measured row pays a server's one-time costs (first allocations, lazily built state).
    Not a figure: on the Zen 3 VM of ADR 0032 a stream's inter-token gaps were flat from
    its first tokens on, and the rows moved within their spread with and without it."""
    with httpx.Client() as client:
        one_stream(client, url, model, "Say hello.", namespace="warm-up", max_tokens=16)


def decode_rate(arrivals: Sequence[Sequence[float]]) -> float:
    """Tokens after each stream's first, per second of the span in which streams decode."""
    streams = [a for a in arrivals if len(a) > 1]
    if not streams:
        return float("nan")
    span = max(a[-1] for a in streams) - min(a[0] for a in streams)
    return sum(len(a) - 1 for a in streams) / span


def _q(values: Sequence[float], q: float) -> float:
    return quantile(values, q)


class MlxLmServer:
    """``mlx_lm.server`` at its defaults on the same weights, with OpenBLAS preloaded."""

    def __init__(self, model_path: Path, log: Path, *extra: str) -> None:
        """``extra``: more of its flags (``--prompt-cache-bytes N``)."""
        self.model = str(model_path)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "LD_PRELOAD": "libopenblas.so.0"}
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlx_lm.server",
                "--model",
                str(model_path),
                "--port",
                str(self.port),
                *extra,
            ],
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{self.url}/v1/models", timeout=2)
                return
            except httpx.HTTPError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError("mlx_lm.server did not start")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
