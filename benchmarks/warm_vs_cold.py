"""Warm equals cold: continuing from restored blocks gives the same tokens as a cold prefill.

    python -m benchmarks.warm_vs_cold [--conversations 20] [--max-history 2048]

For each multi-turn conversation of real text, an earlier request leaves its KV as blocks;
the full conversation is then answered (32 greedy tokens) once from those blocks and once
cold. Prints, per conversation, whether the tokens agree and the largest absolute
difference between the two paths' first-token log-probabilities.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import cast

import mlx.core as mx

from benchmarks.common import load_bench
from benchmarks.corpus import spread
from semantic.adapters.mlx.backend import MlxBackend
from semantic.application.engine.batch_engine import BlockPoolBatchEngine
from semantic.application.engine.events import CompletionEvent
from semantic.application.scheduler.pacer import PacerConfig
from semantic.domain.blocks import AgentBlocks
from semantic.domain.generation import GREEDY

NEW_TOKENS = 32


def run(
    engine: BlockPoolBatchEngine, prompt: list[int], n: int, cached: AgentBlocks | None = None
) -> CompletionEvent:
    request_id = engine.submit("bench", prompt, cached, max_tokens=n)
    while engine.has_work():
        for event in engine.step().events:
            if isinstance(event, CompletionEvent) and event.request_id == request_id:
                done = event
    return done


def first_logprobs(
    backend: MlxBackend, prompt: Sequence[int], blocks: AgentBlocks | None, n_cached: int
) -> mx.array:
    """Log-probabilities after the prompt, prefilled in the engine's aligned chunks."""
    backend.open_sequence(
        "probe",
        restored=blocks,
        n_restored=n_cached,
        n_new=len(prompt) - n_cached,
        sampling=GREEDY,
    )
    position = n_cached
    while True:
        end = min((position // 256 + 1) * 256, len(prompt))
        if end == len(prompt):
            logprobs = backend.prefill_logprobs("probe", prompt[position:end])
            break
        backend.prefill("probe", prompt[position:end])
        position = end
    backend.close_sequence("probe", 0)
    return logprobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--max-history", type=int, default=2048)
    args = parser.parse_args()
    bench = load_bench()
    tokenizer = bench.tokenizer
    engine = bench.engine(pacer=PacerConfig(fixed_tokens=256))
    backend = bench.backend()  # a second backend on the same model, for the probes alone
    agree, worst = 0, 0.0
    print(f"{'conv':>4} {'history':>7} {'cached':>6} {'equal':>5} {'max |dlogprob|':>14}")
    count = lambda m: len(tokenizer.render_chat(m))  # noqa: E731 - a one-line measure
    for index, messages in enumerate(spread(args.conversations, args.max_history, 1000, count)):
        earlier, full = tokenizer.render_chat(messages[:-2]), tokenizer.render_chat(messages)
        first = run(engine, earlier, 4)
        assert first.blocks is not None
        warm = run(engine, full, NEW_TOKENS, first.blocks)
        cold = run(engine, full, NEW_TOKENS)
        n_cached = warm.stats.cached_tokens
        gap = mx.abs(
            first_logprobs(backend, full, first.blocks, n_cached)
            - first_logprobs(backend, full, None, 0)
        )
        diff = cast(float, mx.max(gap).item())  # a float32 array's item is a float
        engine.release_blocks(first.request_id)
        for done in (warm, cold):
            engine.release_blocks(done.request_id)
        equal = warm.token_ids == cold.token_ids
        agree += equal
        worst = max(worst, float(diff))
        print(f"{index:>4} {len(full):>7} {n_cached:>6} {equal!s:>5} {float(diff):>14.3g}")
    print(
        f"\nwarm == cold: {agree} of {args.conversations} conversations ({NEW_TOKENS} greedy "
        f"tokens each); largest first-token |dlogprob|: {worst:.3g}"
    )


if __name__ == "__main__":
    main()
