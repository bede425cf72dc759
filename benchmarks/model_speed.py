"""Prefill and decode speed of the embedded model through the engine's backend.

    python -m benchmarks.model_speed

Prints prefill tokens/s for a 512-token prompt (the engine's 256-token chunks) and
single-sequence decode tokens/s. Targets on a 2-core x86 CPU: >= 200 and >= 17.
"""

from __future__ import annotations

import random

from benchmarks.common import load_bench, median, timed
from semantic.domain.generation import SamplingParams

PROMPT_TOKENS = 512
DECODE_TOKENS = 64
REPEATS = 3


def main() -> None:
    bench = load_bench()
    backend = bench.backend()
    backend.warm_up()
    rng = random.Random(0)
    vocab = bench.tokenizer.vocab_size
    prefill_rates, decode_rates = [], []
    for repeat in range(REPEATS):
        prompt = [rng.randrange(100, vocab) for _ in range(PROMPT_TOKENS)]
        seq = f"bench-{repeat}"
        backend.open_sequence(
            seq, restored=None, n_restored=0, n_new=PROMPT_TOKENS, sampling=SamplingParams()
        )

        def prefill(seq: str = seq, prompt: list[int] = prompt) -> int:
            for start in range(0, PROMPT_TOKENS - 256, 256):
                backend.prefill(seq, prompt[start : start + 256])
            return backend.prefill_and_sample(seq, prompt[PROMPT_TOKENS - 256 :]).token

        first, seconds = timed(prefill)
        prefill_rates.append(PROMPT_TOKENS / seconds)
        backend.start_decoding(seq, first, DECODE_TOKENS + 10)
        backend.decode_step()  # joins the batch
        backend.decode_step()

        def decode() -> None:
            for _ in range(DECODE_TOKENS):
                backend.decode_step()

        _, seconds = timed(decode)
        decode_rates.append(DECODE_TOKENS / seconds)
        backend.close_sequence(seq, 0)
    prefill_rate, decode_rate = median(prefill_rates), median(decode_rates)
    print(f"prefill, {PROMPT_TOKENS}-token prompt: {prefill_rate:.0f} tokens/s (target >= 200)")
    print(f"decode, one sequence:        {decode_rate:.1f} tokens/s (target >= 17)")


if __name__ == "__main__":
    main()
