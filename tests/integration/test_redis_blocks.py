"""The shared block tier's Redis adapter against a real redis-server on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
import xxhash
from reliability.services.redis import RedisServer

from semantic.adapters.storage.block_files import BlockFiles
from semantic.adapters.storage.redis_blocks import FIRST_BACKOFF_S, RedisSharedBlocks, redis_key
from semantic.domain.block_identity import chain_keys, chain_root
from semantic.domain.errors import CacheCorruptionError
from semantic.ports.shared_blocks import SharedBlock, SharedHead


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


def test_a_file_from_the_tier_is_kept_only_if_its_checksum_holds(tmp_path: Path) -> None:
    files = BlockFiles(tmp_path / "blocks")
    data = b"\x08" + bytes(100)
    checksum = xxhash.xxh3_128_hexdigest(data)
    with pytest.raises(CacheCorruptionError):
        files.write_bytes("ab" * 32, data[:-1] + b"\x01", checksum)
    assert not files.has("ab" * 32)
    files.write_bytes("ab" * 32, data, checksum)
    assert files.path("ab" * 32).read_bytes() == data
    assert files.file_bytes("ab" * 32, checksum) == data
    assert files.file_bytes("ab" * 32, "another checksum") is None
    assert files.file_bytes("cd" * 32, checksum) is None
