"""The shared block tier's Redis adapter against a real redis-server on loopback."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest
import redis
import xxhash
from reliability.services.redis import RedisServer

from semantic.adapters.mlx.kv.host_codec import MlxHostCodec
from semantic.adapters.mlx.kv.kv_payloads import kv_arrays
from semantic.adapters.storage.block_files import BlockFiles
from semantic.adapters.storage.kv_block_store import KVBlockStore
from semantic.adapters.storage.redis_blocks import FIRST_BACKOFF_S, RedisSharedBlocks, redis_key
from semantic.domain.block_identity import chain_keys, chain_root
from semantic.domain.errors import CacheCorruptionError
from semantic.ports.shared_blocks import SharedBlock, SharedHead
from tests.integration.test_storage import kv_blocks


def block(key: str, namespace: str = "default", data: bytes = b"block file bytes") -> SharedBlock:
    head = SharedHead(
        key, "parent-key", namespace, "fp", (1, 2, 70000), xxhash.xxh3_128_hexdigest(data)
    )
    return SharedBlock(head, data)


def test_a_block_round_trips_with_its_content_address(redis_url: str) -> None:
    tier = RedisSharedBlocks(redis_url)
    stored = block("k1", data=bytes(range(256)) * 1000)
    assert tier.put(stored)
    assert tier.get("k1") == stored
    assert tier.heads(["k1", "k2"]) == {"k1": stored.head}
    with redis.Redis.from_url(redis_url) as client:  # inspectable from redis-cli
        fields = client.hgetall(redis_key("k1"))
    assert fields[b"namespace"] == b"default"
    assert fields[b"fingerprint"] == b"fp"
    assert fields[b"checksum"] == stored.head.checksum.encode()


def test_the_tiers_usage_counts_its_blocks_and_memory(redis_url: str) -> None:
    tier = RedisSharedBlocks(redis_url)
    empty = tier.usage()
    assert empty is not None
    assert empty.blocks == 0
    tier.put(block("k1", data=bytes(100_000)))
    tier.put(block("k2", namespace="other"))
    held = tier.usage()
    assert held is not None
    assert held.blocks == 2  # every tenant's: the tier's own totals
    assert held.used_bytes >= empty.used_bytes + 100_000
    assert RedisSharedBlocks("redis://127.0.0.1:1").usage() is None  # unreachable: none


class Wall:
    """Wall-clock seconds that move one a call: each use later than the one before."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        self.now += 1
        return self.now


def test_a_namespace_over_its_quota_gives_up_its_own_least_recently_used_blocks(
    redis_url: str,
) -> None:
    tier = RedisSharedBlocks(redis_url, wall=Wall())
    for n in range(5):
        tier.put(block(f"a{n}", "team-a", bytes(1000)))
    tier.put(block("b0", "team-b", bytes(1000)))
    assert tier.get("a0") is not None  # used again: now the most recent of team-a's
    assert tier.held("team-a") == 5000
    assert tier.trim("team-a", 2500) == ["a1", "a2", "a3"]
    assert tier.held("team-a") == 2000
    assert [k for k in ("a0", "a1", "a2", "a3", "a4") if tier.get(k)] == ["a0", "a4"]
    assert tier.get("b0") is not None  # another tenant's: never touched
    assert tier.held("team-b") == 1000
    assert tier.trim("team-b", 1000) == []
    usage = tier.usage()
    assert usage is not None
    assert usage.blocks == 3  # the namespaces' lists are not blocks


def test_blocks_gone_from_redis_leave_the_namespaces_count(redis_url: str) -> None:
    tier = RedisSharedBlocks(redis_url)
    for key in ("a0", "a1", "a2"):
        tier.put(block(key, "team-a", bytes(1000)))
    with redis.Redis.from_url(redis_url) as client:
        client.delete(redis_key("a0"))  # as Redis's own LRU evicts under maxmemory
    assert tier.held("team-a") == 2000
    tier.discard(["a1"])
    assert tier.held("team-a") == 1000
    assert RedisSharedBlocks("redis://127.0.0.1:1").held("team-a") is None


def test_missing_and_discarded_blocks_are_misses(redis_url: str) -> None:
    tier = RedisSharedBlocks(redis_url)
    assert tier.get("nowhere") is None
    assert tier.heads(["nowhere"]) == {}
    tier.put(block("k1"))
    tier.discard(["k1"])
    assert tier.get("k1") is None
    assert tier.reachable


def test_a_key_already_held_is_not_written_over(redis_url: str) -> None:
    tier = RedisSharedBlocks(redis_url)
    first = block("k1", data=b"first")
    assert tier.put(first)
    assert tier.put(block("k1", data=b"second"))
    assert tier.get("k1") == first


def test_a_hash_missing_a_field_is_a_miss(redis_url: str) -> None:
    tier = RedisSharedBlocks(redis_url)
    tier.put(block("k1"))
    with redis.Redis.from_url(redis_url) as client:
        client.hdel(redis_key("k1"), "tokens")
    assert tier.get("k1") is None
    assert tier.heads(["k1"]) == {}


def test_namespaces_never_share_a_block(redis_url: str) -> None:
    """The same prompt in two namespaces: disjoint keys, so one tenant's blocks are never
    another's hit in the shared tier either (ADR 0005)."""
    prompt = list(range(600))
    ours = chain_keys(chain_root("fp", "tenant-a"), prompt, 256)
    theirs = chain_keys(chain_root("fp", "tenant-b"), prompt, 256)
    assert not set(ours) & set(theirs)
    tier = RedisSharedBlocks(redis_url)
    for key in ours:
        tier.put(block(key, namespace="tenant-a"))
    assert tier.heads(theirs) == {}
    assert all(tier.get(key) is None for key in theirs)


def test_an_unreachable_redis_is_a_fast_miss_and_is_tried_again(tmp_path: Path) -> None:
    now = [0.0]
    server = RedisServer(tmp_path / "redis")
    server.start()
    tier = RedisSharedBlocks(server.url, clock=lambda: now[0])

    def reachable() -> bool:  # read afresh each time (mypy would narrow the property)
        return tier.reachable

    assert tier.put(block("k1"))
    server.stop()
    assert tier.get("k1") is None
    assert not reachable()
    assert not tier.put(block("k2"))
    server.start()  # back on the same port, empty (nothing persisted)
    try:
        assert not tier.put(block("k2")), "within the backoff, Redis is not tried"
        now[0] += FIRST_BACKOFF_S  # past the backoff: tried again
        assert tier.put(block("k2"))
        assert reachable()
        assert tier.get("k2") == block("k2")
    finally:
        server.stop()


def test_a_file_from_the_tier_reads_as_the_file_does_if_its_checksum_holds(
    tmp_path: Path,
) -> None:
    files = BlockFiles(tmp_path / "blocks")
    store = KVBlockStore(files, MlxHostCodec())
    key = "ab" * 32
    checksum = store.save(key, kv_blocks(n_tokens=40)).checksum
    data = files.file_bytes(key, checksum)
    assert data == files.path(key).read_bytes()
    assert files.file_bytes(key, "another checksum") is None
    assert files.file_bytes("cd" * 32, checksum) is None
    for read, parsed in zip(
        store.load(key, checksum), store.load_bytes(key, data, checksum), strict=True
    ):
        assert (read.layer, read.start, read.n_tokens) == (
            parsed.layer,
            parsed.start,
            parsed.n_tokens,
        )
        for a, b in zip(kv_arrays(read.data), kv_arrays(parsed.data), strict=True):
            assert mx.array_equal(a, b).item()
    flipped = bytearray(data)
    flipped[-1] ^= 1
    for bad in (bytes(flipped), data[:-8], b""):
        with pytest.raises(CacheCorruptionError):
            store.load_bytes(key, bad, checksum)
    with pytest.raises(CacheCorruptionError):  # consistent bytes, but not the recorded file
        store.load_bytes(key, data[:-8], xxhash.xxh3_128_hexdigest(data[:-8]))
