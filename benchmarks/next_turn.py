"""Where the realistic next turn's time goes, after a restart, at one history length.

    python -m benchmarks.next_turn [--history 4096]

Through HTTP: a conversation is answered (cold), the server restarts, and the next turn
(history + the reply + a short question) is sent; the client's time to first token is
printed beside the server's own account of that request (restore from disk, queue and cache
build, prefill of the new tokens). Then, in process, the floor: the new tokens' forward pass
over the whole context with the KV already in a contiguous cache.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchmarks.common import load_bench, median
from benchmarks.corpus import conversation
from benchmarks.resume import QUESTION, stream_ttft
from benchmarks.servers import steady_server
from benchmarks.warm_vs_cold import run
from semantic.application.scheduler.pacer import PacerConfig
from semantic.domain.chat import ChatMessage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--history", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    bench = load_bench()
    tokenizer = bench.tokenizer
    history = conversation(
        100 + args.history, args.history, lambda m: len(tokenizer.render_chat(m))
    )
    messages = [{"role": m.role, "content": m.content} for m in history]
    ttfts = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            data = Path(tmp) / f"d{repeat}"
            with steady_server(data).start() as server:
                _, reply, _ = stream_ttft(server.url, messages, "profile")
                server.stop()
            turn = [
                *messages,
                {"role": "assistant", "content": reply},
                {"role": "user", "content": QUESTION},
            ]
            with steady_server(data).start() as server:
                ttft, _, cached = stream_ttft(server.url, turn, "profile")
                server.stop()
            ttfts.append(ttft)
            print(f"next turn after a restart: {ttft * 1e3:.0f} ms to first token, {cached} cached")
            print(f"  server: {server_account(server.log)}")
    engine = bench.engine(pacer=PacerConfig(fixed_tokens=256))
    prompt = tokenizer.render_chat(history)
    first = run(engine, prompt, 16)
    assert first.blocks is not None
    reply_text = tokenizer.decode(list(first.token_ids))
    turn_prompt = tokenizer.render_chat(
        [*history, ChatMessage("assistant", reply_text), ChatMessage("user", QUESTION)]
    )
    floors, builds = [], []
    for _ in range(args.repeats):
        done = run(engine, turn_prompt, 1, first.blocks)
        engine.release_blocks(done.request_id)
        floors.append(done.stats.prefill_s)
        builds.append(done.stats.queued_s)
    new = done.stats.computed_tokens
    print(
        f"\nfloor, in process, KV in memory: {new} new tokens over {len(turn_prompt)} of context"
        f" {median(floors) * 1e3:.0f} ms (cache build from memory blocks"
        f" {median(builds) * 1e3:.0f} ms)"
    )
    print(f"next turn over HTTP after a restart, median: {median(ttfts) * 1e3:.0f} ms")


def server_account(log: Path) -> str:
    lines = [line for line in log.read_text().splitlines() if "restore" in line]
    return lines[-1].split("INFO", 1)[-1].strip() if lines else "(no account in the log)"


if __name__ == "__main__":
    main()
