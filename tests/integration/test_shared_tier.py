"""The shared block tier at the cache's level: real model, real block files and SQLite,
real Redis. A block another instance wrote (here: its file gone from this disk) restores
from Redis exactly and stays on disk; a corrupt or evicted one is a miss and is computed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import redis
from reliability.services.redis import RedisServer
from sqlalchemy import select

from semantic.adapters.mlx.backend import MlxBackend
from semantic.adapters.mlx.cpu import accelerator_for
from semantic.adapters.mlx.kv.host_codec import MlxHostCodec
from semantic.adapters.storage.block_files import BlockFiles
from semantic.adapters.storage.kv_block_store import KVBlockStore
from semantic.adapters.storage.redis_blocks import RedisSharedBlocks, redis_key
from semantic.adapters.storage.schema import blocks
from semantic.adapters.storage.sql_metadata import SqlMetadataStore
from semantic.application.cache.store import AgentCacheStore, CachedPrefix
from semantic.application.engine.batch_engine import BlockPoolBatchEngine, EngineConfig
from semantic.application.engine.events import CompletionEvent
from semantic.domain.block_pool import BlockPool
from tests.integration.conftest import RealModel

pytestmark = pytest.mark.model

FINGERPRINT = "shared-tier-test"
TEXT = " ".join(f"Note {i}: the tide tables for harbour {i % 7} changed." for i in range(60))


class Instance:
    """One server's cache, wired as the composition root wires it, on its own directory."""

    def __init__(self, model: RealModel, data_dir: Path, redis_url: str | None) -> None:
        self.files = BlockFiles(data_dir / "blocks")
        self.metadata = SqlMetadataStore(data_dir / "semantic.db")
        self.pool = BlockPool.from_budget(model.spec, 512 << 20)
        eos = model.tokenizer.eos_token_ids
        backend = MlxBackend(
            model.loaded.model,
            model.spec,
            "test",
            eos,
            accelerator=accelerator_for(model.loaded.model),
        )
        self.store = AgentCacheStore(
            self.pool,
            model.spec,
            FINGERPRINT,
            block_store=KVBlockStore(self.files, MlxHostCodec()),
            agent_records=self.metadata,
            block_records=self.metadata,
            shared=None if redis_url is None else RedisSharedBlocks(redis_url),
        )
        self.engine = BlockPoolBatchEngine(
            backend, model.tokenizer, self.pool, EngineConfig(), reclaim=self.store.reclaim
        )

    async def start(self) -> Instance:
        await self.metadata.open()
        await self.store.start()
        return self

    async def close(self) -> None:
        await self.store.close()
        await self.metadata.close()

    async def ask(self, prompt: Sequence[int], n: int = 6) -> tuple[CompletionEvent, CachedPrefix]:
        prefix = await self.store.prepare("default", prompt)
        request_id = self.engine.submit(
            "agent", prompt, prefix.blocks, max_tokens=n, stored=prefix.stored
        )
        self.store.release(prefix)
        done = None
        while self.engine.has_work():
            for event in self.engine.step().events:
                if isinstance(event, CompletionEvent):
                    self.store.adopt(event, "agent")
                    done = event if event.request_id == request_id else done
        await self.store.flush_shared()
        assert done is not None
        return done, prefix

    async def shared_column(self) -> dict[str, bool]:
        async with self.metadata.engine().connect() as connection:
            rows = await connection.execute(select(blocks.c.key, blocks.c.shared))
            return {row.key: bool(row.shared) for row in rows}


@pytest.fixture
def prompt(real_model: RealModel) -> list[int]:
    tokens = real_model.tokenizer.encode(TEXT)
    assert len(tokens) > 3 * 256
    return tokens[: 3 * 256 + 40]


async def test_blocks_are_published_and_marked_shared_once_redis_has_them(
    real_model: RealModel, tmp_path: Path, redis_url: str, prompt: list[int]
) -> None:
    one = await Instance(real_model, tmp_path / "one", redis_url).start()
    try:
        await one.ask(prompt)
        shared = await one.shared_column()
    finally:
        await one.close()
    assert len(shared) == 4  # three whole blocks and the turn's partial one
    assert all(shared.values())
    with redis.Redis.from_url(redis_url) as client:
        for key in shared:
            data = client.hget(redis_key(key), "data")
            assert data == one.files.path(key).read_bytes()
    assert one.store.stats.shared_published == 4


async def _served_then_files_gone(
    model: RealModel, data_dir: Path, redis_url: str, prompt: list[int]
) -> tuple[tuple[int, ...], dict[str, bytes]]:
    """A first instance answers ``prompt``; then its block files leave the disk (as on an
    instance whose metadata another one wrote). Returns the answer and the files' bytes."""
    first = await Instance(model, data_dir, redis_url).start()
    try:
        done, _ = await first.ask(prompt)
    finally:
        await first.close()
    files = {p.name.split(".")[0]: p.read_bytes() for p in data_dir.glob("blocks/*/*.safetensors")}
    for path in data_dir.glob("blocks/*/*.safetensors"):
        path.unlink()
    return done.token_ids, files


async def test_a_block_missing_on_disk_restores_from_redis_exactly_and_stays_on_disk(
    real_model: RealModel, tmp_path: Path, redis_url: str, prompt: list[int]
) -> None:
    answer, files = await _served_then_files_gone(real_model, tmp_path, redis_url, prompt)
    again = await Instance(real_model, tmp_path, redis_url).start()
    try:
        done, prefix = await again.ask(prompt)
    finally:
        await again.close()
    assert prefix.disk_tokens > 3 * 256  # the whole blocks and the partial tail
    assert done.stats.cached_tokens == len(prompt) - 1  # all but the last token, as ever
    assert done.token_ids == answer
    assert again.store.stats.shared_fetched == 4
    assert again.store.stats.corrupt_blocks == 0
    kept = {p.name.split(".")[0]: p.read_bytes() for p in tmp_path.glob("blocks/*/*.safetensors")}
    for key, data in files.items():  # the same bytes: the same KV, bit for bit
        assert kept[key] == data


async def test_a_corrupt_redis_block_is_discarded_counted_and_recomputed(
    real_model: RealModel, tmp_path: Path, redis_url: str, prompt: list[int]
) -> None:
    answer, files = await _served_then_files_gone(real_model, tmp_path, redis_url, prompt)
    again = await Instance(real_model, tmp_path, redis_url).start()
    keys = await again.metadata.blocks(list(files))
    first_key = next(k for k, r in keys.items() if r.parent_key == again.store.root("default"))
    with redis.Redis.from_url(redis_url) as client:
        data = bytearray(client.hget(redis_key(first_key), "data") or b"")
        data[len(data) // 2] ^= 0xFF
        client.hset(redis_key(first_key), "data", bytes(data))
    try:
        done, prefix = await again.ask(prompt)
        assert prefix.matched_tokens == 0
        assert done.stats.cached_tokens == 0
        assert done.token_ids == answer
        assert again.store.stats.shared_corrupt == 1
        assert again.store.stats.corrupt_blocks == 0, "nothing local was quarantined"
        assert again.files.path(first_key).read_bytes() == files[first_key], "computed again"
        with redis.Redis.from_url(redis_url) as client:  # the bad copy went; the good one came
            assert client.hget(redis_key(first_key), "data") == files[first_key]
        done, prefix = await again.ask(prompt)  # now from this disk
        assert done.stats.cached_tokens == len(prompt) - 1
    finally:
        await again.close()


async def test_an_evicted_redis_block_is_a_miss_where_the_prefix_stops(
    real_model: RealModel, tmp_path: Path, redis_url: str, prompt: list[int]
) -> None:
    answer, files = await _served_then_files_gone(real_model, tmp_path, redis_url, prompt)
    again = await Instance(real_model, tmp_path, redis_url).start()
    records = await again.metadata.blocks(list(files))
    by_parent = {r.parent_key: r.key for r in records.values() if len(r.tokens) == 256}
    second = by_parent[by_parent[again.store.root("default")]]
    with redis.Redis.from_url(redis_url) as client:
        client.delete(redis_key(second))  # as Redis's LRU would
    try:
        done, _ = await again.ask(prompt)
    finally:
        await again.close()
    assert done.stats.cached_tokens == 256
    assert done.token_ids == answer
    assert again.store.stats.shared_misses >= 1
    assert again.store.stats.corrupt_blocks == 0


async def test_an_unreachable_redis_costs_sharing_never_the_answer(
    real_model: RealModel, tmp_path: Path, prompt: list[int]
) -> None:
    one = await Instance(real_model, tmp_path, "redis://127.0.0.1:1/0").start()
    try:
        assert one.store.shared_state == "unreachable"
        first, _ = await one.ask(prompt)
        done, _ = await one.ask(prompt)
        shared = await one.shared_column()
    finally:
        await one.close()
    assert done.token_ids == first.token_ids
    assert done.stats.cached_tokens >= 3 * 256
    assert one.store.stats.shared_dropped >= 4
    assert shared
    assert not any(shared.values()), "nothing is marked shared that Redis lacks"


async def test_a_prompt_another_instance_answered_restores_from_redis_without_its_rows(
    real_model: RealModel, tmp_path: Path, redis_url: str, prompt: list[int]
) -> None:
    """Each instance with its own SQLite: this one's metadata knows nothing of the prompt,
    so its whole blocks are looked up in Redis by their keys (tokens compared)."""
    first = await Instance(real_model, tmp_path / "first", redis_url).start()
    try:
        answer, _ = await first.ask(prompt)
    finally:
        await first.close()
    other = await Instance(real_model, tmp_path / "other", redis_url).start()
    try:
        done, prefix = await other.ask(prompt)
        kept = await other.shared_column()
    finally:
        await other.close()
    assert prefix.disk_tokens == 3 * 256  # whole blocks only: tails are found through rows
    assert done.stats.cached_tokens == 3 * 256
    assert done.token_ids == answer.token_ids
    assert other.store.stats.shared_fetched == 3
    assert len(kept) == 4, "what came from Redis is this instance's own now, rows and files"
    assert all(other.files.has(key) for key in kept)


async def test_a_corrupt_file_here_is_replaced_by_the_good_copy_in_redis(
    real_model: RealModel, tmp_path: Path, redis_url: str, prompt: list[int]
) -> None:
    """Its row (shared by every instance, in a cluster) is not quarantined."""
    one = await Instance(real_model, tmp_path, redis_url).start()
    try:
        answer, _ = await one.ask(prompt)
        records = await one.metadata.blocks(list(one.files.keys()))
        first = next(k for k, r in records.items() if r.parent_key == one.store.root("default"))
        good = one.files.path(first).read_bytes()
        bad = bytearray(good)
        bad[-100] ^= 0xFF
        one.files.path(first).write_bytes(bytes(bad))
        one.store.reclaim(1 << 30)  # memory emptied: the next restore reads the files
        done, prefix = await one.ask(prompt)
        row = (await one.metadata.blocks([first]))[first]
    finally:
        await one.close()
    assert prefix.disk_tokens > 3 * 256
    assert done.token_ids == answer.token_ids
    assert one.store.stats.corrupt_blocks == 1
    assert not row.quarantined
    assert one.files.path(first).read_bytes() == good, "written anew by the save"


async def test_blocks_redis_evicted_under_its_memory_cap_are_misses(
    real_model: RealModel, tmp_path: Path, prompt: list[int]
) -> None:
    """A real ``maxmemory`` with ``allkeys-lru``: Redis drops blocks as they come."""
    capped = RedisServer(tmp_path / "redis", maxmemory="30mb")
    capped.start()
    try:
        first = await Instance(real_model, tmp_path / "first", capped.url).start()
        try:
            answer, _ = await first.ask(prompt)
        finally:
            await first.close()
        with redis.Redis.from_url(capped.url) as client:
            assert int(client.info("stats")["evicted_keys"]) > 0
        other = await Instance(real_model, tmp_path / "other", capped.url).start()
        try:
            done, _ = await other.ask(prompt)
        finally:
            await other.close()
    finally:
        capped.stop()
    assert done.stats.cached_tokens < 3 * 256
    assert done.token_ids == answer.token_ids
    assert other.store.stats.corrupt_blocks == 0
