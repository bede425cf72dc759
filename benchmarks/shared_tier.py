"""What the shared block tier costs: pushing a turn's blocks to Redis, and restoring a
prefix from Redis beside restoring it from this instance's own disk.

    python -m benchmarks.shared_tier [--sizes 1024,4096] [--runs 5]

A real ``redis-server`` on loopback (Debian's package) and a real server's services: for
each size, an anonymous prompt of about that many tokens is answered, and the time from the
reply to its blocks being in Redis (``flush_shared``) is printed. Then a second cache, on
an empty data directory as another instance's would be, restores the prompt's prefix: from
Redis (read, verified, written to its disk, read back), then, with its memory emptied,
from its own disk (files in the page cache). Median of ``--runs``, each on a fresh
directory.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from reliability.services.redis import RedisServer

from benchmarks.common import median
from benchmarks.corpus import conversation
from benchmarks.machine import print_machine
from semantic.adapters.cli.progress import ProgressPrinter
from semantic.adapters.mlx.kv.host_codec import MlxHostCodec
from semantic.adapters.storage.block_files import BlockFiles
from semantic.adapters.storage.kv_block_store import KVBlockStore
from semantic.adapters.storage.redis_blocks import RedisSharedBlocks
from semantic.adapters.storage.sql_metadata import SqlMetadataStore
from semantic.application.cache.store import AgentCacheStore
from semantic.application.chat.generation import GenerationInput
from semantic.bootstrap import Services, start_services, stop_services
from semantic.config import Settings
from semantic.domain.block_pool import BlockPool


async def from_redis(
    services: Services, prompt: tuple[int, ...], directory: Path, url: str
) -> tuple[float, int]:
    """Milliseconds for a cache on an empty directory (another instance's) to restore
    ``prompt``'s prefix from Redis, and the tokens it restored."""
    metadata = SqlMetadataStore(directory / "semantic.db")
    await metadata.open()
    store = AgentCacheStore(
        BlockPool.from_budget(services.spec, 2 << 30),
        services.spec,
        services.cache.fingerprint,
        block_store=KVBlockStore(BlockFiles(directory / "blocks"), MlxHostCodec()),
        agent_records=metadata,
        block_records=metadata,
        shared=RedisSharedBlocks(url),
    )
    await store.start()
    try:
        started = time.perf_counter()
        prefix = await store.prepare("default", prompt)
        elapsed = (time.perf_counter() - started) * 1000
        store.release(prefix)
        return elapsed, prefix.disk_tokens
    finally:
        await store.close()
        await metadata.close()


async def from_disk(services: Services, prompt: tuple[int, ...]) -> tuple[float, int]:
    """Milliseconds for the instance that computed ``prompt`` to restore its prefix from its
    own disk (files in the page cache), its memory emptied first."""
    services.cache.reclaim(1 << 30)
    started = time.perf_counter()
    prefix = await services.cache.prepare("default", prompt)
    elapsed = (time.perf_counter() - started) * 1000
    services.cache.release(prefix)
    return elapsed, prefix.disk_tokens


async def measure(sizes: list[int], runs: int, tmp: Path, url: str) -> None:
    settings = Settings(data_dir=tmp / "served", kv_budget_bytes=2 << 30, shared_blocks_url=url)
    services = await start_services(settings, ProgressPrinter())
    tokenizer = services.tokenizer
    print("prompt  publish ms  Redis: tokens  ms    disk: tokens  ms    Redis/disk")
    try:
        for size in sizes:
            messages = conversation(size, size, lambda m: len(tokenizer.render_chat(m)))
            prompt = tuple(tokenizer.render_chat(messages))
            await services.generation.complete(GenerationInput(prompt, max_tokens=8))
            started = time.perf_counter()
            await services.cache.flush_shared()
            publish = (time.perf_counter() - started) * 1000
            redis, disk = [], []
            for run in range(runs):  # alternated, so the machine's drift falls on both
                redis.append(await from_redis(services, prompt, tmp / f"other-{size}-{run}", url))
                disk.append(await from_disk(services, prompt))
            redis_ms, disk_ms = median([r[0] for r in redis]), median([d[0] for d in disk])
            print(
                f"{len(prompt):6d}  {publish:10.1f}  {redis[0][1]:13d}  {redis_ms:6.1f}"
                f"  {disk[0][1]:11d}  {disk_ms:6.1f}  {redis_ms / disk_ms:9.2f}",
                flush=True,
            )
    finally:
        await stop_services(services, 5.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="1024,4096")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print_machine()
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        redis = RedisServer(tmp / "redis")
        redis.start()
        try:
            sizes = [int(s) for s in args.sizes.split(",")]
            asyncio.run(measure(sizes, args.runs, tmp, redis.url))
        finally:
            redis.stop()


if __name__ == "__main__":
    main()
