"""Two hundred requests on the real model, mixing finish, cancel and pool exhaustion.

    python -m reliability.engine_leaks [--requests 200]

The pool is small on purpose so that requests asking for more than it holds end
``pool_exhausted``. Afterwards the pool must be back to its starting usage, and its peak
must equal the most blocks the live requests (and the completions not yet handed back)
ever held at once.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from dataclasses import dataclass, field

import benchmarks  # noqa: F401 - OpenBLAS before MLX
from benchmarks.common import load_bench

from semantic.application.engine.events import CompletionEvent
from semantic.domain.chat import ChatMessage
from semantic.domain.generation import FinishReason

WORDS = ("apple", "river", "stone", "cloud", "lamp", "ship", "forest", "glass", "music", "tower")


@dataclass
class LeakResult:
    outcomes: Counter[str] = field(default_factory=Counter)
    start_usage: int = 0
    end_usage: int = 0
    peak: int = 0
    live_peak: int = 0
    books_balanced_every_step: bool = True


def run(requests: int = 200, seed: int = 11) -> LeakResult:
    rng = random.Random(seed)
    bench = load_bench()
    spec = bench.spec
    engine = bench.engine(budget_bytes=spec.n_layers * spec.block_bytes * 6)  # 1,536 positions
    pool = engine.pool
    result = LeakResult(start_usage=pool.used_count)
    pool.reset_peak()
    submitted = 0
    cancel_at: dict[str, int] = {}
    steps = 0
    while submitted < requests or engine.has_work():
        if submitted < requests and rng.random() < 0.6:
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(3, 30)))
            prompt = bench.tokenizer.render_chat([ChatMessage("user", f"Talk about {words}.")])
            greedy = rng.random() < 0.15  # asks for more than the pool can ever hold
            request_id = engine.submit(
                "leaks", prompt, max_tokens=2000 if greedy else rng.randrange(1, 24)
            )
            submitted += 1
            if rng.random() < 0.15:
                cancel_at[request_id] = steps + rng.randrange(0, 8)
        for request_id, when in list(cancel_at.items()):
            if when <= steps:
                engine.cancel(request_id)
                del cancel_at[request_id]
        step = engine.step()
        steps += 1
        finished = [e for e in step.events if isinstance(e, CompletionEvent)]
        held = sum(e.blocks.block_count() for e in finished if e.blocks)
        live = sum(r.reservation.block_count for r in engine._running.values())  # noqa: SLF001
        if pool.used_count != live + held + result.start_usage:
            result.books_balanced_every_step = False
        result.live_peak = max(result.live_peak, live + held)
        for event in finished:
            result.outcomes[event.finish_reason.value] += 1
            engine.release_blocks(event.request_id)
    result.end_usage = pool.used_count
    result.peak = pool.usage().peak_used - result.start_usage
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    result = run(args.requests)
    print(f"outcomes: {dict(result.outcomes)}")
    print(
        f"pool usage: start {result.start_usage}, end {result.end_usage}; peak {result.peak} "
        f"blocks, live requests' largest need {result.live_peak}; books balanced every step: "
        f"{result.books_balanced_every_step}"
    )
    exhausted = result.outcomes[FinishReason.POOL_EXHAUSTED.value]
    print(f"pool exhaustion: {exhausted} times")


if __name__ == "__main__":
    main()
