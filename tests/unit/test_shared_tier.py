"""The shared tier's rules, at its port: what is pushed, dropped, trusted and discarded."""

from __future__ import annotations

from collections.abc import Sequence

from semantic.application.cache.shared_tier import SharedTier
from semantic.application.cache.stats import CacheStats
from semantic.domain.errors import CacheCorruptionError
from semantic.domain.quotas import NamespaceQuotas, Quota
from semantic.ports.block_store import LayerPayload
from semantic.ports.metadata_store import BlockRecord
from semantic.ports.shared_blocks import SharedBlock, SharedHead, SharedUsage
from tests.unit.storage_fakes import FakeBlockStore, FakeMetadataStore


class FakeSharedBlocks:
    def __init__(self) -> None:
        self.blocks: dict[str, SharedBlock] = {}
        self.reachable = True
        self.discarded: list[str] = []
        self.trims: list[str] = []

    def put(self, block: SharedBlock) -> bool:
        if self.reachable:
            self.blocks.setdefault(block.head.key, block)
        return self.reachable

    def get(self, key: str) -> SharedBlock | None:
        return self.blocks.get(key) if self.reachable else None

    def heads(self, keys: Sequence[str]) -> dict[str, SharedHead]:
        return {k: self.blocks[k].head for k in keys if k in self.blocks and self.reachable}

    def discard(self, keys: Sequence[str]) -> None:
        self.discarded += keys
        for key in keys:
            self.blocks.pop(key, None)

    def held(self, namespace: str) -> int | None:
        blocks = self.blocks.values()
        return sum(len(b.data) for b in blocks if b.head.namespace == namespace)

    def trim(self, namespace: str, limit: int) -> list[str]:
        """Oldest first (the fake's order is the order of its puts)."""
        self.trims.append(namespace)
        dropped = []
        for key in [k for k, b in self.blocks.items() if b.head.namespace == namespace]:
            if (self.held(namespace) or 0) <= limit:
                break
            dropped.append(key)
            del self.blocks[key]
        return dropped

    def probe(self) -> bool:
        return self.reachable

    def usage(self) -> SharedUsage | None:
        size = sum(len(block.data) for block in self.blocks.values())
        return SharedUsage(len(self.blocks), size, None) if self.reachable else None

    def close(self) -> None:
        pass


class FilesOnDisk(FakeBlockStore):
    """A block store with bytes: ``load_bytes`` checks them against the checksum."""

    def __init__(self) -> None:
        super().__init__()
        self.raw: dict[str, bytes] = {}

    def file_bytes(self, key: str, checksum: str) -> bytes | None:
        data = self.raw.get(key)
        return data if data is not None and checksum == f"sum:{data!r}" else None

    def load_bytes(self, key: str, data: bytes, checksum: str) -> list[LayerPayload]:
        if checksum != f"sum:{data!r}":
            raise CacheCorruptionError("checksum mismatch")
        return [LayerPayload(0, 0, 3, data)]


def record(key: str, data: bytes, namespace: str = "default") -> BlockRecord:
    return BlockRecord(key, "root", namespace, (1, 2, 3), len(data), f"sum:{data!r}")


def head(key: str, data: bytes, namespace: str = "default", fingerprint: str = "fp") -> SharedHead:
    return SharedHead(key, "root", namespace, fingerprint, (1, 2, 3), f"sum:{data!r}")


def tier(
    quotas: NamespaceQuotas | None = None,
) -> tuple[SharedTier, FakeSharedBlocks, FilesOnDisk, FakeMetadataStore, CacheStats]:
    shared, files, metadata, stats = (
        FakeSharedBlocks(),
        FilesOnDisk(),
        FakeMetadataStore(),
        CacheStats(),
    )
    return (
        SharedTier(shared, files, metadata, stats, "fp", quotas=quotas, probe_s=0.01),
        shared,
        files,
        metadata,
        stats,
    )


async def test_committed_blocks_are_pushed_and_marked_shared_once_there() -> None:
    shared_tier, shared, files, metadata, stats = tier()
    files.raw["k1"] = b"one"
    metadata.block_rows["k1"] = record("k1", b"one")
    await shared_tier.start()
    shared_tier.publish("default", [record("k1", b"one"), record("gone", b"x")])
    await shared_tier.flush()
    await shared_tier.close()
    assert shared.blocks["k1"].data == b"one"
    assert shared.blocks["k1"].head == head("k1", b"one")
    assert "gone" not in shared.blocks  # collected before its push: skipped
    assert metadata.shared == {"k1"}
    assert stats.shared_published == 1


async def test_nothing_is_queued_while_the_tier_is_unreachable() -> None:
    shared_tier, shared, files, metadata, stats = tier()
    shared.reachable = False
    files.raw["k1"] = b"one"
    await shared_tier.start()
    assert shared_tier.state == "unreachable"
    shared_tier.publish("default", [record("k1", b"one")])
    await shared_tier.flush()
    await shared_tier.close()
    assert stats.shared_dropped == 1
    assert not metadata.shared


def test_a_corrupt_copy_is_discarded_and_counted_and_a_miss() -> None:
    shared_tier, shared, _, _, stats = tier()
    shared.blocks["k1"] = SharedBlock(head("k1", b"one"), b"0ne")
    assert not shared_tier.fetch(record("k1", b"one"))
    assert shared.discarded == ["k1"]
    assert stats.shared_corrupt == 1


def test_another_file_of_a_block_is_a_miss_and_kept() -> None:
    """Redis holds a good file whose checksum is not the one this metadata recorded (an
    older serialisation): not corrupt, but not this row's bytes either."""
    shared_tier, shared, _, _, stats = tier()
    shared.blocks["k1"] = SharedBlock(head("k1", b"other"), b"other")
    assert not shared_tier.fetch(record("k1", b"one"))
    assert shared.discarded == []
    assert stats.shared_misses == 1


def test_a_block_read_from_the_tier_is_used() -> None:
    shared_tier, shared, _, _, stats = tier()
    shared.blocks["k1"] = SharedBlock(head("k1", b"one"), b"one")
    assert shared_tier.fetch(record("k1", b"one")) == [LayerPayload(0, 0, 3, b"one")]
    assert stats.shared_fetched == 1


async def test_rows_from_the_tier_are_only_this_namespace_and_model() -> None:
    shared_tier, shared, _, _, _ = tier()
    shared.blocks["a"] = SharedBlock(head("a", b"1"), b"1")
    shared.blocks["b"] = SharedBlock(head("b", b"2", namespace="other"), b"2")
    shared.blocks["c"] = SharedBlock(head("c", b"3", fingerprint="another model"), b"3")
    assert await shared_tier.records("default", ["a", "b", "c", "d"]) == {
        "a": BlockRecord("a", "root", "default", (1, 2, 3), 0, "sum:b'1'")
    }


async def test_a_namespace_with_a_quota_in_the_tier_is_trimmed_after_its_pushes_only() -> None:
    shared_tier, shared, files, _, stats = tier(NamespaceQuotas({"team-a": Quota(shared_bytes=6)}))
    records = {ns: [record(f"{ns}{n}", b"abc", ns) for n in range(3)] for ns in ("team-a", "b")}
    for rows in records.values():
        files.raw.update((row.key, b"abc") for row in rows)
    await shared_tier.start()
    for namespace, rows in records.items():
        shared_tier.publish(namespace, rows)
    await shared_tier.flush()
    await shared_tier.close()
    assert shared.trims == ["team-a"]  # the namespace without a quota is never trimmed
    assert sorted(shared.blocks) == ["b0", "b1", "b2", "team-a1", "team-a2"]
    assert stats.shared_trimmed == 1
