"""KV kept 8- or 4-bit at rest: bytes per token, and how often greedy answers still agree.

    python -m benchmarks.kv_at_rest [--conversations 10] [--max-history 2048]

For each multi-turn conversation of real text, an earlier request leaves its KV as blocks.
Each at-rest mode writes those blocks to block files and reads them back (what a restore
from disk after a restart gets); the full conversation is then answered (32 greedy tokens)
from the blocks read back and compared with the lossless answer.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

from benchmarks.common import load_bench
from benchmarks.corpus import spread
from benchmarks.warm_vs_cold import NEW_TOKENS, run
from semantic.adapters.mlx.kv.host_codec import AT_REST_BITS, MlxHostCodec
from semantic.adapters.storage.block_files import BlockFiles
from semantic.adapters.storage.kv_block_store import KVBlockStore
from semantic.application.scheduler.pacer import PacerConfig
from semantic.domain.blocks import AgentBlocks, KVBlock


def through_disk(blocks: AgentBlocks, store: KVBlockStore) -> tuple[AgentBlocks, int]:
    """``blocks`` written and read back through ``store``; and the bytes written."""
    by_index: dict[int, list[KVBlock]] = {}
    for block in blocks:
        by_index.setdefault(block.index, []).append(block)
    read_back: dict[tuple[int, int], KVBlock] = {}
    written = 0
    for index, group in by_index.items():
        stored = store.save(f"{index:064x}", group)
        written += stored.nbytes
        loaded = store.load(f"{index:064x}", stored.checksum)
        for block, payload in zip(group, loaded, strict=True):
            read_back[block.layer, index] = dataclasses.replace(block, payload=payload.data)
    layers = tuple(
        tuple(read_back[b.layer, b.index] for b in layer_blocks) for layer_blocks in blocks.layers
    )
    return AgentBlocks(blocks.agent_id, blocks.token_ids, layers), written


def matching_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--conversations", type=int, default=10)
    parser.add_argument("--max-history", type=int, default=2048)
    args = parser.parse_args()
    bench = load_bench()
    tokenizer = bench.tokenizer
    engine = bench.engine(pacer=PacerConfig(fixed_tokens=256))
    totals = {
        mode: {"bytes": 0, "tokens": 0, "same": 0, "prefix": 0, "answered": 0}
        for mode in AT_REST_BITS
    }
    with tempfile.TemporaryDirectory() as tmp:
        count = lambda m: len(tokenizer.render_chat(m))  # noqa: E731 - a one-line measure
        conversations = spread(args.conversations, args.max_history, 2000, count)
        for index, messages in enumerate(conversations):
            earlier, full = tokenizer.render_chat(messages[:-2]), tokenizer.render_chat(messages)
            first = run(engine, earlier, 4)
            assert first.blocks is not None
            answers = {}
            for mode in AT_REST_BITS:
                files = BlockFiles(Path(tmp) / f"{index}-{mode}")
                blocks, written = through_disk(
                    first.blocks, KVBlockStore(files, MlxHostCodec(mode))
                )
                done = run(engine, full, NEW_TOKENS, blocks)
                engine.release_blocks(done.request_id)
                answers[mode] = done.token_ids
                totals[mode]["bytes"] += written
                totals[mode]["tokens"] += blocks.n_tokens
            engine.release_blocks(first.request_id)
            for mode, answer in answers.items():
                totals[mode]["same"] += answer == answers["lossless"]
                totals[mode]["prefix"] += matching_prefix(answer, answers["lossless"])
                totals[mode]["answered"] += len(answers["lossless"])
    n = args.conversations
    print(
        f"{'at rest':>8} {'bytes/token':>11} {'smaller':>7} {'same answer':>14}"
        f" {'tokens before the first difference':>34}"
    )
    lossless = totals["lossless"]["bytes"] / totals["lossless"]["tokens"]
    for mode, t in totals.items():
        per_token = t["bytes"] / t["tokens"]
        print(
            f"{mode:>8} {per_token:>11.0f} {lossless / per_token:>6.2f}x {t['same']:>8} of {n:<3}"
            f" {t['prefix'] / t['answered']:>33.0%}"
        )


if __name__ == "__main__":
    main()
