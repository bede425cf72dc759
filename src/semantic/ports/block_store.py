"""The block store port: durable KV block files, one per block key."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from semantic.domain.blocks import KVBlock


@dataclass(frozen=True, slots=True)
class StoredFile:
    nbytes: int
    checksum: str


@dataclass(frozen=True, slots=True)
class LayerPayload:
    """One layer's KV of a block read back from disk."""

    layer: int
    start: int
    n_tokens: int
    data: object


class DiskSpace(Protocol):
    """The room on the file system a store's files live on, and what it sets aside."""

    def free_bytes(self) -> int | None:
        """Bytes free on the store's file system; None where that cannot be known."""
        ...

    def release_space(self, *, headroom: bool) -> int:
        """Free what the store holds only to reuse (files kept to be written over) and,
        with ``headroom``, the room it keeps for a full disk; returns the bytes freed."""
        ...

    def keep_headroom(self, *, leaving: int) -> bool:
        """Set aside the room a full disk's evictions need again, if the disk has it and
        ``leaving`` bytes more; returns whether it is set aside."""
        ...


class BlockStore(Protocol):
    """Writes are durable when they return (ADR 0006); reads are verified against the
    checksum recorded at write time. Every method may block on disk: call from a worker."""

    def save(self, key: str, layers: Sequence[KVBlock]) -> StoredFile:
        """Persist one block (every layer that holds it) under ``key``."""
        ...

    def load(self, key: str, checksum: str) -> list[LayerPayload]:
        """Read a block back; raises ``CacheCorruptionError`` for a missing, truncated or
        altered file."""
        ...

    def has(self, key: str) -> bool:
        """Whether this store holds a file for ``key`` (unverified)."""
        ...

    def file_bytes(self, key: str, checksum: str) -> bytes | None:
        """The block's file, byte for byte, if it is there and matches ``checksum``: what
        the shared tier keeps (``ports.shared_blocks``)."""
        ...

    def load_bytes(self, key: str, data: bytes, checksum: str) -> list[LayerPayload]:
        """``load`` of a block file held in memory (read from the shared tier); raises
        ``CacheCorruptionError`` as ``load`` does."""
        ...

    def quarantine(self, key: str) -> None:
        """Move a bad file aside so it is never read again."""
        ...

    def delete(self, key: str) -> None: ...

    def keys(self) -> set[str]:
        """Keys of every block file present."""
        ...

    def remove_temporaries(self) -> int:
        """Delete files an interrupted write left behind; returns how many."""
        ...

    @property
    def space(self) -> DiskSpace:
        """The file system the files live on, as the disk's keeper manages it."""
        ...
