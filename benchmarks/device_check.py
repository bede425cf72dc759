"""The device check: on any MLX device, the promises that matter, measured and printed.

    python -m benchmarks.device_check --device gpu     # what scripts/device-check.sh runs
    python -m benchmarks.device_check --device cpu     # its dry run, on any machine

On a random-weight model of the embedded model's shape (``random_model.py``: a GPU box
needs only the tokenizer's files), through the real server (``semantic serve --device``):
a 4K-history next turn from disk after a restart against the same turn cold, which must
give the same greedy tokens (warm == cold); decode tokens/s for 1 and 16 streams in
process; then the conformance matrix (``tests/conformance``) on the same device. Each part
prints what it measured or why it failed, and the rest still run; the exit status says
whether all passed. Parts that would overrun ``--budget-s`` are skipped and said so.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import Bench, load_bench
from benchmarks.corpus import conversation
from benchmarks.decode_scaling import engine_rate
from benchmarks.random_model import write_random_llama
from benchmarks.resume import QUESTION, stream_ttft
from benchmarks.servers import steady_server
from semantic.config import Settings, default_model_cache_dir

EMBEDDED_DIR = default_model_cache_dir() / "smollm2-135m-instruct-float32"
REPO = Path(__file__).resolve().parent.parent


class Check:
    """Runs the parts in order within one time budget and remembers which failed."""

    def __init__(self, budget_s: float) -> None:
        self.deadline = time.monotonic() + budget_s
        self.failed: list[str] = []

    def seconds_left(self) -> float:
        return max(1.0, self.deadline - time.monotonic())

    def part(self, name: str, needs_s: float, body: Callable[[], None]) -> None:
        left = self.deadline - time.monotonic()
        if left < needs_s:
            print(
                f"[{name}] skipped: {left:.0f} s left of the budget, it needs about {needs_s:.0f}"
            )
            return
        started = time.monotonic()
        try:
            body()
            print(f"[{name}] passed in {time.monotonic() - started:.1f} s", flush=True)
        except Exception as error:  # noqa: BLE001 - a check reports every failure and goes on
            self.failed.append(name)
            print(f"[{name}] FAILED: {type(error).__name__}: {error}", flush=True)
            traceback.print_exc(limit=6)


def next_turn_from_disk(model: Path, device: str, bench: Bench, history_tokens: int) -> None:
    tokenizer = bench.tokenizer
    history = conversation(7, history_tokens, lambda m: len(tokenizer.render_chat(m)))
    messages = [{"role": m.role, "content": m.content} for m in history]
    args = ("--model", str(model), "--device", device)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "warm"
        with steady_server(data, *args).start() as server:
            _, reply, _ = stream_ttft(server.url, messages, "agent")
            server.stop()
        turn = [
            *messages,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": QUESTION},
        ]
        with steady_server(data, *args).start() as server:
            warm_s, warm_text, cached = stream_ttft(server.url, turn, "agent")
            server.stop()
        with steady_server(Path(tmp) / "cold", *args).start() as server:
            cold_s, cold_text, _ = stream_ttft(server.url, turn, "agent")
            server.stop()
    prompt = len(tokenizer.render_chat(history)) + len(tokenizer.encode(reply)) + 20
    print(
        f"next turn, ~{prompt}-token history: from disk after a restart {warm_s * 1e3:.0f} ms "
        f"({cached} cached), cold {cold_s * 1e3:.0f} ms: {cold_s / warm_s:.1f}x faster"
    )
    print(f"warm == cold (greedy text of the next turn): {warm_text == cold_text}")
    if warm_text != cold_text:
        raise AssertionError(f"warm {warm_text!r} != cold {cold_text!r}")


def decode_rates(bench: Bench) -> None:
    for streams in (1, 16):
        print(f"decode, {streams:>2} streams: {engine_rate(bench, streams):7.1f} tokens/s")


def conformance(device: str, tokenizer: Path, seconds: float) -> None:
    """The matrix on this device, its progress printed as it runs (a run cut short by the
    budget still shows how far it got), stopped when the budget is spent."""
    folder = REPO / "tests" / "conformance"
    if not folder.is_dir():
        print("no tests/conformance in this checkout: nothing to run")
        return
    env = {**os.environ, "SEMANTIC_TEST_DEVICE": device, "SEMANTIC_TEST_TOKENIZER": str(tokenizer)}
    command = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", str(folder)]
    try:
        done = subprocess.run(command, cwd=REPO, env=env, timeout=seconds, check=False)
    except subprocess.TimeoutExpired:
        said = f"the matrix did not finish within the budget ({seconds:.0f} s)"
        raise AssertionError(said) from None
    if done.returncode != 0:
        raise AssertionError(f"pytest exited {done.returncode}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "gpu", "auto"), default="gpu")
    parser.add_argument("--tokenizer", type=Path, default=EMBEDDED_DIR)
    parser.add_argument("--history", type=int, default=4096)
    parser.add_argument(
        "--budget-s", type=float, default=None, help="default: 300 (a GPU), 720 (the CPU)"
    )
    args = parser.parse_args()
    check = Check(args.budget_s or (720.0 if args.device == "cpu" else 300.0))
    with tempfile.TemporaryDirectory() as tmp:
        model = write_random_llama(Path(tmp) / "random-smollm2-shape", args.tokenizer)
        bench = load_bench(Settings(model=str(model), device=args.device))
        check.part(
            "next turn from disk",
            60,
            lambda: next_turn_from_disk(model, args.device, bench, args.history),
        )
        check.part("decode 1 and 16 streams", 20, lambda: decode_rates(bench))
        check.part(
            "conformance matrix",
            60,
            lambda: conformance(args.device, args.tokenizer, check.seconds_left()),
        )
    outcome = "FAILED: " + ", ".join(check.failed) if check.failed else "all passed"
    print(f"device check: {outcome}")
    sys.exit(1 if check.failed else 0)


if __name__ == "__main__":
    main()
