"""An agent's next turn over a 4K history, resumed on another instance from Redis, beside the
same turn resumed on its own instance from disk after a restart, and beside cold.

    python -m benchmarks.cluster [--history 4096] [--repeats 3]

A local cluster (``reliability.cluster``: PostgreSQL, Redis, two instances A and B). Each
repeat takes two fresh namespaces, so no block of one measurement can serve another:

- *from Redis*: A answers the history cold, then B, which never saw it, answers the next
  turn (history + A's reply + a short question); B finds the blocks in neither its memory
  nor its disk, and reads them from Redis.
- *from disk*: A answers the same history cold in the other namespace, restarts (its memory
  empty), and answers the same next turn from its own disk.

Times are to the first streamed token, at the client. Targets (issue 37): from Redis at most
2x from disk, and at least 20x faster than cold.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import httpx
from reliability.cluster import LocalCluster

from benchmarks.common import load_bench, median
from benchmarks.corpus import conversation
from benchmarks.resume import QUESTION, stream_ttft

UPLOAD_WAIT_S = 3.0
"""Blocks reach Redis within about a second of the reply, off the request path."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--history", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tokenizer = load_bench().tokenizer
    history = conversation(
        100 + args.history, args.history, lambda m: len(tokenizer.render_chat(m))
    )
    messages = [{"role": m.role, "content": m.content} for m in history]
    print(f"history: {len(tokenizer.render_chat(history))} tokens")
    colds, redis, disk = [], [], []
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(Path(tmp), instances=2) as cluster:
        a, b = cluster.servers
        client = httpx.Client()
        for repeat in range(args.repeats):
            shared_ns, local_ns = f"shared-{repeat}", f"local-{repeat}"
            cold, reply, _ = stream_ttft(a.url, messages, shared_ns, client)
            cold_again = stream_ttft(a.url, messages, local_ns, client)[0]
            colds += [cold, cold_again]
            turn = [*messages, {"role": "assistant", "content": reply}]
            turn.append({"role": "user", "content": QUESTION})
            time.sleep(UPLOAD_WAIT_S)
            from_redis, _, redis_cached = stream_ttft(b.url, turn, shared_ns, client)
            redis.append(from_redis)
            a = cluster.restart(0)
            from_disk, _, disk_cached = stream_ttft(a.url, turn, local_ns, client)
            disk.append(from_disk)
            print(
                f"repeat {repeat}: cold {cold * 1e3:.0f} and {cold_again * 1e3:.0f} ms; next turn "
                f"on another instance "
                f"from Redis {from_redis * 1e3:.0f} ms ({redis_cached} cached); on its own "
                f"instance from disk {from_disk * 1e3:.0f} ms ({disk_cached} cached)"
            )
    _summary(median(colds), median(redis), median(disk))


def _summary(cold: float, redis: float, disk: float) -> None:
    print(
        f"\nmedians: cold {cold * 1e3:.0f} ms | next turn from disk (same instance, restarted) "
        f"{disk * 1e3:.0f} ms | next turn from Redis (another instance) {redis * 1e3:.0f} ms"
    )
    print(f"from Redis / from disk: {redis / disk:.2f}x (target at most 2x)")
    print(f"cold / from Redis: {cold / redis:.1f}x faster (target at least 20x)")


if __name__ == "__main__":
    main()
