"""One command for the benchmarks: ours beside mlx-lm on the same prompts, in the same run.

    python -m benchmarks            # quick: histories up to 4,096 tokens, ours and mlx-lm
    python -m benchmarks --full     # + 7,680 tokens, + llama.cpp where llama-cpp-python installs

Writes ``bench-results/results.json``, ``results.md`` and PNG plots, and prints a summary
with each target beside its measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
from reliability.server import ServerProcess

from benchmarks import concurrency, llama_cpp, persistence, report, resume
from benchmarks.common import Bench, load_bench
from semantic.application.events import CompletionEvent
from semantic.domain.chat import ChatMessage

QUICK_SIZES = (512, 1024, 2048, 4096)
FULL_SIZES = (*QUICK_SIZES, 7680)
AGENTS = (1, 2, 4, 8, 16, 32)


def overhead(bench: Bench, repeats: int = 5) -> dict[str, float]:
    """A 64-token reply through HTTP against the same request straight into the engine.
    One path after the other: taken in turns, each process's idle BLAS threads (they spin
    for a while after a product) slowed the other's requests (+10%)."""
    prompt = "Write a long story about a lighthouse keeper."
    tokens = bench.tokenizer.render_chat([ChatMessage("user", prompt)])
    engine = bench.engine()
    direct = []
    for index in range(repeats + 1):  # the first run warms the engine up, as the server's does
        started = time.perf_counter()
        engine.submit("bench", tokens, max_tokens=64, namespace=f"o{index}")
        while engine.has_work():
            for event in engine.step().events:
                if isinstance(event, CompletionEvent):
                    engine.release_blocks(event.request_id)
        if index:
            direct.append(time.perf_counter() - started)
    with tempfile.TemporaryDirectory() as tmp:
        http = []
        with ServerProcess(Path(tmp) / "overhead").start() as server:
            for index in range(repeats):
                body = {
                    "model": "default",
                    "messages": [{"role": "user", "content": prompt}],
                    "temperature": 0,
                    "max_tokens": 64,
                }
                started = time.perf_counter()
                httpx.post(
                    f"{server.url}/v1/chat/completions",
                    json=body,
                    timeout=300,
                    headers={"X-Namespace": f"o{index}"},
                ).raise_for_status()
                http.append(time.perf_counter() - started)
            server.stop()
    d, h = statistics.median(direct), statistics.median(http)
    return {"engine_s": d, "http_s": h, "overhead_fraction": (h - d) / h}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument(
        "--skip",
        default="",
        help="comma-separated parts to skip (resume, concurrency, persistence, overhead);"
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
    # First, while this process holds only our model: the in-process engine measured after the
    # resume part (which loads mlx-lm's own copy) ran slower than the server, a -14% overhead.
    if "overhead" not in skip:
        results["overhead"] = overhead(bench)
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
    rows = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        ServerProcess(Path(tmp) / "concurrency").start() as server,
    ):
        for agents in AGENTS:
            rows.append(concurrency.measure(server.url, "semantic", agents))
        server.stop()
    theirs: concurrency.MlxLmServer | None = None
    try:
        for agents in AGENTS:
            for attempt in (1, 2):  # mlx_lm.server sometimes aborts under load: restart once
                theirs = theirs or concurrency.MlxLmServer(model_path, out / "mlx_lm.server.log")
                try:
                    row = concurrency.measure(
                        theirs.url, "mlx_lm.server", agents, model=theirs.model
                    )
                except httpx.HTTPError as error:
                    code = theirs.process.poll()
                    print(
                        f"mlx_lm.server failed at {agents} agents, try {attempt}: {error}, {code=}"
                    )
                    theirs.stop()
                    theirs = None
                    continue
                rows.append(row)
                break
    finally:
        if theirs is not None:
            theirs.stop()
    return rows


async def persistence_rows(sizes: tuple[int, ...]) -> list[dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        return [await persistence.measure(n, Path(tmp) / f"p{n}") for n in sizes]


if __name__ == "__main__":
    main()
