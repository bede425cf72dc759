"""What restoring a cache from blocks costs, against a plain copy of the same bytes.

    python -m benchmarks.gather_cost

Gathers a 4,096-token conversation's blocks (16 per layer, 30 layers, 189 MB in float32)
into one contiguous cache per layer, and copies the same bytes into an already-touched
buffer. Target: the gather at most 1.5x the copy.
"""

from __future__ import annotations

import time

import mlx.core as mx
import numpy as np

from benchmarks.common import load_bench, median
from semantic.adapters.mlx.kv.kv_blocks import gather_cache
from semantic.adapters.mlx.kv.kv_payloads import MlxKV
from semantic.domain.blocks import AgentBlocks, KVBlock

TOKENS = 4096
REPEATS = 7


def main() -> None:
    bench = load_bench()
    spec = bench.spec
    shape = (1, spec.n_kv_heads, spec.block_tokens, spec.k_head_dim)
    layers = tuple(
        tuple(
            KVBlock(
                layer * 100 + i,
                layer,
                i,
                spec.block_tokens,
                MlxKV(mx.random.normal(shape), mx.random.normal(shape)),
            )
            for i in range(TOKENS // spec.block_tokens)
        )
        for layer in range(spec.n_layers)
    )
    mx.eval([(b.payload.keys, b.payload.values) for layer in layers for b in layer])  # type: ignore[attr-defined]
    blocks = AgentBlocks("bench", tuple(range(TOKENS)), layers)
    nbytes = spec.kv_bytes(TOKENS)

    streams = (mx.default_stream(mx.cpu), mx.new_stream(mx.cpu))
    gathers = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        gather_cache(bench.loaded.model, blocks, TOKENS, 0, spec, streams=streams)
        gathers.append(time.perf_counter() - start)

    source = np.frombuffer(np.random.bytes(nbytes), dtype=np.uint8)
    target = np.ones(nbytes, dtype=np.uint8)
    copies = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        np.copyto(target, source)
        copies.append(time.perf_counter() - start)
    gather, copy = median(gathers), median(copies)
    print(f"{TOKENS} tokens, {nbytes / 1e6:.0f} MB of KV")
    print(f"gather blocks -> cache: {gather * 1e3:.1f} ms")
    print(f"copy into touched buffer: {copy * 1e3:.1f} ms")
    print(f"ratio: {gather / copy:.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    main()
