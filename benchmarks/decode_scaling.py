"""Aggregate decode speed with 1-16 concurrent sequences: the engine vs mlx-lm directly.

    python -m benchmarks.decode_scaling

Targets (2-core CPU): one sequence >= 17 tokens/s; 8 sequences >= 4x and 16 >= 7x that;
the engine within 10% of driving mlx-lm's BatchGenerator directly.
"""

from __future__ import annotations

import time
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator

from benchmarks.common import Bench, load_bench
from semantic.application.scheduler.pacer import PacerConfig
from semantic.domain.chat import ChatMessage

SIZES = (1, 2, 4, 8, 16)
STEPS = 40
TOPICS = (
    "rivers",
    "bread",
    "stars",
    "clocks",
    "bees",
    "glass",
    "maps",
    "salt",
    "rain",
    "trains",
    "paper",
    "music",
    "iron",
    "tea",
    "wind",
    "shells",
)


def prompts(bench: Bench, n: int) -> list[list[int]]:
    return [
        bench.tokenizer.render_chat([ChatMessage("user", f"Write a long essay about {t}.")])
        for t in TOPICS[:n]
    ]


def engine_rate(bench: Bench, n: int) -> float:
    engine = bench.engine(pacer=PacerConfig(fixed_tokens=2048))
    ids = [
        engine.submit("bench", prompt, max_tokens=STEPS + 20, stop=())
        for prompt in prompts(bench, n)
    ]
    while engine.step().decoding < n:
        pass
    engine.step()
    start, tokens = time.perf_counter(), 0
    for _ in range(STEPS):
        tokens += sum(1 for e in engine.step().events if hasattr(e, "token_id"))
    rate = tokens / (time.perf_counter() - start)
    for request_id in ids:  # tidy up for the next size
        engine.cancel(request_id)
    while engine.has_work():
        engine.step()
    return rate


def direct_rate(bench: Bench, n: int) -> float:
    generator: Any = BatchGenerator(  # mlx-lm leaves its methods unannotated
        bench.loaded.model,
        max_tokens=STEPS + 20,
        stop_tokens=[[2]],
        completion_batch_size=32,
        prefill_batch_size=32,
        stream=mx.new_stream(mx.cpu),
    )
    generator.insert(prompts(bench, n))
    while len(generator.next()[1]) < n:
        pass
    start, tokens = time.perf_counter(), 0
    for _ in range(STEPS):
        tokens += len(generator.next()[1])
    rate = tokens / (time.perf_counter() - start)
    generator.close()
    return rate


def main() -> None:
    bench = load_bench()
    bench.backend().warm_up()  # MLX compiles and allocates once, for every backend after
    print(
        f"{'seqs':>4} {'engine tok/s':>12} {'x one':>6} {'mlx-lm tok/s':>12} {'engine/mlx-lm':>13}"
    )
    one = None
    for n in SIZES:
        ours, theirs = engine_rate(bench, n), direct_rate(bench, n)
        one = one or ours
        print(f"{n:>4} {ours:>12.1f} {ours / one:>6.2f} {theirs:>12.1f} {ours / theirs:>13.2f}")


if __name__ == "__main__":
    main()
