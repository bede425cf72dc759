"""The embedded model in each weight format, in one run, with llama.cpp beside it.

    python -m benchmarks.weight_formats [--prompt 1024] [--formats float32,quantized,q8]

For each format (``--weights``): the bytes of weights the loaded model holds, a cold
prefill (tokens/s, the engine's 256-token chunks) and the decode rate of 1, 8 and 16
sequences through the engine. llama.cpp (``llama-cpp-python``, where it is installed)
runs the GGUF those formats come from (Q4_1): a cold prefill of the same prompt, and 1, 8
and 16 sequences after a short prompt each, decoding in one batch a step (its C batch
API). llama.cpp runs first, before any thread of ours exists. ADR 0031 has the numbers.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path
from typing import Any

from mlx.utils import tree_flatten

from benchmarks import llama_cpp
from benchmarks.common import Bench, open_bench, timed
from benchmarks.decode_scaling import engine_rate
from benchmarks.machine import print_machine
from semantic.adapters.mlx.cpu.blas import report_blas
from semantic.adapters.mlx.devices import use_device
from semantic.config import Settings
from semantic.domain.generation import SamplingParams

STREAMS = (1, 8, 16)


def weight_bytes(bench: Bench) -> int:
    parameters: Any = tree_flatten(bench.loaded.model.parameters())  # (path, array) pairs
    return sum(int(array.nbytes) for _, array in parameters)


def prefill_rate(bench: Bench, prompt: list[int]) -> float:
    backend = bench.backend()
    backend.open_sequence(
        "cold", restored=None, n_restored=0, n_new=len(prompt), sampling=SamplingParams()
    )
    chunks = [prompt[i : i + 256] for i in range(0, len(prompt), 256)]

    def prefill() -> int:
        for chunk in chunks[:-1]:
            backend.prefill("cold", chunk)
        return backend.prefill_and_sample("cold", chunks[-1]).token

    _, seconds = timed(prefill)
    backend.close_sequence("cold", 0)
    return len(prompt) / seconds


def measure(weights: str, prompt: list[int]) -> list[str]:
    bench = open_bench(Settings(weights=weights))
    bench.backend().warm_up()
    prefill = prefill_rate(bench, prompt)
    rates = [engine_rate(bench, n) for n in STREAMS]
    decode = " ".join(f"{rate:>7.1f}" for rate in rates)
    return [f"{weights:<10} {weight_bytes(bench) / 1e6:>9.1f} {prefill:>9.0f}  {decode}"]


def llama_cpp_row(prompt: list[int]) -> str:
    """Its cold prefill of the same prompt, then its streams as ours run them: after a
    short prompt each, all of them in one batch a step."""
    if not llama_cpp.available():
        return "llama.cpp: not installed (pip install llama-cpp-python)"
    with tempfile.TemporaryDirectory() as tmp:
        gguf = llama_cpp.embedded_gguf(Path(tmp))
        state = llama_cpp.LlamaCppState(gguf, len(prompt) + 8, Path(tmp))
        rate = len(prompt) / state.cold(prompt)
        del state
        decode = " ".join(f"{llama_cpp.parallel_decode_rate(gguf, n):>7.1f}" for n in STREAMS)
        size = gguf.stat().st_size
    return f"{'llama.cpp':<10} {size / 1e6:>9.1f} {rate:>9.0f}  {decode}   (its Q4_1 GGUF)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", type=int, default=1024, help="cold prompt tokens")
    parser.add_argument("--formats", default="float32,quantized,q8")
    args = parser.parse_args()
    report_blas()
    print_machine()
    print(f"device: {use_device(Settings().device)}")
    rng = random.Random(0)
    prompt = [rng.randrange(100, 40_000) for _ in range(args.prompt)]
    theirs = llama_cpp_row(prompt)  # first, while no MLX or BLAS thread of ours is about
    rows = []
    for weights in args.formats.split(","):
        rows += measure(weights, prompt)
    rows.append(theirs)
    streams = " ".join(f"{n:>7}" for n in STREAMS)
    print(f"{'weights':<10} {'MB held':>9} {'prefill':>9}  decode tokens/s at {streams} streams")
    print(f"{'':<10} {'':>9} {'tok/s':>9}")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
