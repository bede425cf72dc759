"""One command for the benchmarks: ours beside mlx-lm on the same prompts, in the same run.

    python -m benchmarks            # quick: histories up to 4,096 tokens, ours and mlx-lm
    python -m benchmarks --full     # + 7,680 tokens, + llama.cpp where llama-cpp-python installs,
                                    # + every weight format on both servers (weight_formats)

Writes ``bench-results/results.json``, ``results.md`` and PNG plots, and prints a summary
with each target beside its measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from benchmarks import concurrency, llama_cpp, persistence, report, resume, weight_formats
from benchmarks.common import load_bench
from benchmarks.machine import machine, print_fast_paths
from benchmarks.servers import steady_server
from semantic.domain.chat import ChatMessage

QUICK_SIZES = (512, 1024, 2048, 4096)
FULL_SIZES = (*QUICK_SIZES, 7680)
AGENTS = (1, 2, 4, 8, 16, 32)
ROUNDS = 3
"""Rounds of the concurrency rows, both servers measured in turn (``run_concurrency``)."""


def overhead(repeats: int = 7) -> dict[str, float]:
    """What HTTP adds to a 64-token reply, measured on the same requests from both sides.

    The client times each request; the server's own ``semantic_request_duration_seconds``
    (from the request entering the generation service to its reply, saved) grows by the time
    the same request spent inside. Both sides see one warm process, one prompt, one reply,
    so the difference is what HTTP, parsing and rendering cost, and it cannot go negative.
    An in-process engine as the reference, as before, ran in another process with its own
    threads and heap and came out slower than the server (-17.9%): it measured nothing."""
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        "temperature": 0,
        "max_tokens": 64,
    }
    walls: list[float] = []
    inside: list[float] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        steady_server(Path(tmp) / "overhead").start() as server,
    ):
        with httpx.Client(base_url=server.url, timeout=300) as client:
            for index in range(repeats + 1):  # the first warms the path up
                before = _duration_sum(client)
                started = time.perf_counter()
                reply = client.post(
                    "/v1/chat/completions", json=body, headers={"X-Namespace": f"o{index}"}
                )
                wall = time.perf_counter() - started
                reply.raise_for_status()
                if index:
                    walls.append(wall)
                    inside.append(_duration_sum(client) - before)
        server.stop()
    shares = [(w - i) / w for w, i in zip(walls, inside, strict=True)]
    return {
        "engine_s": statistics.median(inside),
        "http_s": statistics.median(walls),
        "overhead_fraction": statistics.median(shares),
    }


def _duration_sum(client: httpx.Client) -> float:
    """The server's total time spent inside requests so far, from its metrics."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("semantic_request_duration_seconds_sum"):
            return float(line.split()[-1])
    raise RuntimeError("the server's metrics have no semantic_request_duration_seconds_sum")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument(
        "--skip",
        default="",
        help="comma-separated parts to skip (resume, concurrency, persistence, overhead,"
        " formats);"
        " their figures from the last run in --out are kept",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))
    sizes = FULL_SIZES if args.full else QUICK_SIZES
    started = time.monotonic()
    bench = load_bench()

    def count(messages: list[ChatMessage]) -> int:
        return len(bench.tokenizer.render_chat(messages))

    results = earlier_results(args.out, skip) | {"mode": "full" if args.full else "quick"}
    results["machine"] = machine()
    if "overhead" not in skip:
        results["overhead"] = overhead()
        print(f"HTTP overhead for a 64-token reply: {results['overhead']['overhead_fraction']:.1%}")
    if "resume" not in skip:
        with_llama = args.full and llama_cpp.available()
        if args.full and not with_llama:
            print("llama-cpp-python is not installed: llama.cpp columns left out")
        rows = resume.run(sizes, bench.loaded.path, count, with_llama=with_llama)
        results["resume"] = [asdict(r) for r in rows]
        print(report.resume_table(rows))
        save(results, args.out)
    if "concurrency" not in skip:
        results["concurrency"] = [asdict(r) for r in run_concurrency(bench.loaded.path, args.out)]
        print(report.concurrency_table(results["concurrency"]))
        save(results, args.out)
    if "persistence" not in skip:
        results["persistence"] = asyncio.run(persistence_rows(sizes))
        print(report.persistence_table(results["persistence"]))
        save(results, args.out)
    if args.full and "formats" not in skip:
        formats = list(weight_formats.FORMATS)
        results["formats"] = weight_formats.run(formats, 4096, llama_cpp.available())
        save(results, args.out)
    results["seconds"] = time.monotonic() - started
    save(results, args.out)
    (args.out / "results.md").write_text(report.markdown(results))
    report.plots(results, args.out)
    print(report.summary(results))
    minutes = results["seconds"] / 60
    print(f"\nwrote {args.out}/results.json, results.md and plots in {minutes:.1f} min")


def earlier_results(out: Path, skip: set[str]) -> dict[str, Any]:
    """Skipped parts keep the figures of the last run, so a rerun of one part still reports all."""
    path = out / "results.json"
    if not skip or not path.exists():
        return {}
    earlier: dict[str, Any] = json.loads(path.read_text())
    return {part: earlier[part] for part in skip if part in earlier}


def save(results: dict[str, Any], out: Path) -> None:
    """After every part: a later part failing keeps what was measured."""
    (out / "results.json").write_text(json.dumps(results, indent=2))


def run_concurrency(model_path: Path, out: Path) -> list[concurrency.ConcurrencyRow]:
    """Both servers up at once, measured in turn at each agent count, for ``ROUNDS`` rounds;
    each row the median of its rounds. These VMs' speed drifts by a third and more within
    minutes (the same 16-row host pass: 41.5 then 63.0 ms a step, minutes apart, on the Zen 3
    VM of ADR 0026), so one server measured minutes after the other, or one agent minutes
    before sixteen, compared the VM's moods as much as the servers."""
    measured: dict[tuple[str, int], list[concurrency.ConcurrencyRow]] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        steady_server(Path(tmp) / "concurrency").start() as server,
    ):
        print_fast_paths(server.url)
        concurrency.warm_up(server.url)
        theirs: concurrency.MlxLmServer | None = None
        try:
            for round_ in range(1, ROUNDS + 1):
                for agents in AGENTS:
                    ours = concurrency.measure(server.url, "semantic", agents, round_=round_)
                    theirs, row = _measure_mlx_lm(theirs, model_path, out, agents, round_)
                    for measured_row in (ours, row):
                        if measured_row is not None:
                            key = (measured_row.server, agents)
                            measured.setdefault(key, []).append(measured_row)
                    print(
                        f"round {round_}/{ROUNDS}, {agents} agents: decode {ours.decode_per_s:.1f}"
                        f" tokens/s, mlx_lm.server {row.decode_per_s if row else math.nan:.1f}"
                    )
        finally:
            if theirs is not None:
                theirs.stop()
        server.stop()
    return [concurrency.median_row(rows) for rows in measured.values()]


def _measure_mlx_lm(
    theirs: concurrency.MlxLmServer | None, model_path: Path, out: Path, agents: int, round_: int
) -> tuple[concurrency.MlxLmServer | None, concurrency.ConcurrencyRow | None]:
    """mlx_lm.server sometimes aborts under load: restarted once."""
    for attempt in (1, 2):
        theirs = theirs or _warm_mlx_lm(model_path, out)
        try:
            row = concurrency.measure(
                theirs.url, "mlx_lm.server", agents, model=theirs.model, round_=round_
            )
        except httpx.HTTPError as error:
            code = theirs.process.poll()
            print(f"mlx_lm.server failed at {agents} agents, try {attempt}: {error}, {code=}")
            theirs.stop()
            theirs = None
            continue
        return theirs, row
    return theirs, None


def _warm_mlx_lm(model_path: Path, out: Path) -> concurrency.MlxLmServer:
    server = concurrency.MlxLmServer(model_path, out / "mlx_lm.server.log")
    concurrency.warm_up(server.url, model=server.model)
    return server


async def persistence_rows(sizes: tuple[int, ...]) -> list[dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        return [await persistence.measure(n, Path(tmp) / f"p{n}") for n in sizes]


if __name__ == "__main__":
    main()
