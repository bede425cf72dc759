"""Every kernel variant this CPU can run, side by side in one run (issue 44, ADR 0026).

    python -m benchmarks.variants [--history 4096] [--variants avx512,avx2,baseline]

Each variant runs in processes of its own (``SEMANTIC_CPU_VARIANT``; the kernels load once,
before MLX): a cold prompt of about ``--history`` tokens through the server, the next turn
from disk after a restart, and decode tokens/s for 1 and 16 sequences in the engine. The
table gives each figure and its ratio to the widest variant's, with the targets an AVX2
CPU is held to: cold at most 1.3x, decode at least 0.75x, next turn at most 1.2x, and 16
sequences at least 6x one. ``baseline`` is the path an x86 CPU without FMA runs (and what
AVX2 CPUs ran before this variant: sgemv and OpenBLAS, no host pass).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.machine import print_machine
from benchmarks.servers import steady_server
from semantic.adapters.mlx.cpu.kernel_variant import VARIANT_ENV, this_cpus_variants

_RESULT = "variant-result: "


def measure(history_tokens: int) -> dict[str, Any]:
    """This process's variant: cold, next turn from disk, decode at 1 and 16."""
    from benchmarks.common import load_bench
    from benchmarks.corpus import conversation
    from benchmarks.decode_scaling import engine_rate
    from benchmarks.resume import QUESTION, stream_ttft

    bench = load_bench()
    tokenizer = bench.tokenizer
    history = conversation(
        100 + history_tokens, history_tokens, lambda m: len(tokenizer.render_chat(m))
    )
    messages = [{"role": m.role, "content": m.content} for m in history]
    with tempfile.TemporaryDirectory() as tmp:
        with steady_server(Path(tmp)).start() as server:
            cold, reply, _ = stream_ttft(server.url, messages, "variants")
            server.stop()
        turn = [
            *messages,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": QUESTION},
        ]
        with steady_server(Path(tmp)).start() as server:
            next_turn, _, cached = stream_ttft(server.url, turn, "variants")
            server.stop()
    one, sixteen = engine_rate(bench, 1), engine_rate(bench, 16)
    return {
        "cold_s": cold,
        "next_turn_s": next_turn,
        "cached": cached,
        "decode_1": one,
        "decode_16": sixteen,
    }


def run_variant(variant: str, history_tokens: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.variants", "--one", "--history", str(history_tokens)],
        capture_output=True,
        text=True,
        env={**os.environ, VARIANT_ENV: variant},
        timeout=1800,
        check=False,
    )
    for line in done.stdout.splitlines():
        if line.startswith(_RESULT):
            found: dict[str, Any] = json.loads(line.removeprefix(_RESULT))
            return found
    raise RuntimeError(f"{variant} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")


def report(results: dict[str, dict[str, Any]]) -> None:
    widest = next(iter(results.values()))
    print(
        f"\n{'variant':<10}{'cold s':>9}{'x':>7}{'next ms':>9}{'x':>7}"
        f"{'dec 1 t/s':>11}{'x':>7}{'dec 16 t/s':>12}{'16/1':>7}"
    )
    for name, r in results.items():
        print(
            f"{name:<10}{r['cold_s']:>9.2f}{r['cold_s'] / widest['cold_s']:>7.2f}"
            f"{r['next_turn_s'] * 1e3:>9.0f}{r['next_turn_s'] / widest['next_turn_s']:>7.2f}"
            f"{r['decode_1']:>11.1f}{r['decode_1'] / widest['decode_1']:>7.2f}"
            f"{r['decode_16']:>12.1f}{r['decode_16'] / r['decode_1']:>7.2f}"
        )
    if "avx2" in results and next(iter(results)) != "avx2":
        r = results["avx2"]
        checks = {
            "cold <= 1.3x the widest": r["cold_s"] <= 1.3 * widest["cold_s"],
            "decode (1) >= 0.75x the widest": r["decode_1"] >= 0.75 * widest["decode_1"],
            "next turn <= 1.2x the widest": r["next_turn_s"] <= 1.2 * widest["next_turn_s"],
            "16 sequences >= 6x one": r["decode_16"] >= 6 * r["decode_1"],
        }
        for what, met in checks.items():
            print(f"avx2 target: {what}: {'yes' if met else 'NO'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--history", type=int, default=4096)
    parser.add_argument("--variants", default="", help="comma-separated; default: all here")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(_RESULT + json.dumps(measure(args.history)), flush=True)
        return
    print_machine()
    chosen = [v for v in args.variants.split(",") if v] or list(this_cpus_variants())
    results = {}
    for variant in chosen:
        results[variant] = run_variant(variant, args.history)
        print(f"{variant}: {json.dumps(results[variant])}", flush=True)
    report(results)


if __name__ == "__main__":
    main()
