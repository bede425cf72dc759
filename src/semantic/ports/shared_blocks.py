"""The shared block tier port: block files several instances can read (Redis, say).

A block is kept under its chain key, which already encodes the model fingerprint and the
namespace (ADR 0005), so two tenants' blocks never share an entry. Beside the file's exact
bytes it keeps what makes it inspectable and checkable: namespace, fingerprint, parent,
tokens and the file's checksum. The tier is a cache: it may drop any block at any time, and
every method answers at once (a miss, False) when the tier cannot be reached, rather than
wait on it or raise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class SharedHead:
    """What the tier says about a block, without its bytes."""

    key: str
    parent_key: str
    namespace: str
    fingerprint: str
    tokens: tuple[int, ...]
    checksum: str


@dataclass(frozen=True, slots=True)
class SharedBlock:
    head: SharedHead
    data: bytes
    """The block file, byte for byte: its checksum is ``head.checksum``."""


@dataclass(frozen=True, slots=True)
class SharedUsage:
    """What the tier holds, all instances' and tenants' blocks together."""

    blocks: int
    used_bytes: int
    """The store's own count of the memory it uses (blocks, and its overhead)."""
    max_bytes: int | None
    """Its memory limit (Redis ``maxmemory``); None: none set."""


class SharedBlocks(Protocol):
    """Every method may block on the network for at most a short timeout: call it from a
    worker thread, never the event loop."""

    @property
    def reachable(self) -> bool:
        """Whether the last exchange with the tier succeeded."""
        ...

    def put(self, block: SharedBlock) -> bool:
        """Store ``block`` unless the tier holds its key already; False if unreachable."""
        ...

    def get(self, key: str) -> SharedBlock | None:
        """The block, or None if the tier does not hold it or cannot be reached."""
        ...

    def heads(self, keys: Sequence[str]) -> dict[str, SharedHead]:
        """The heads of those of ``keys`` the tier holds (one round trip)."""
        ...

    def discard(self, keys: Sequence[str]) -> None:
        """Remove blocks (a bad copy, or blocks no record uses any more)."""
        ...

    def held(self, namespace: str) -> int | None:
        """Bytes of block files the tier holds for ``namespace`` (None: unreachable)."""
        ...

    def trim(self, namespace: str, limit: int) -> list[str]:
        """Remove the namespace's least recently used blocks until it holds at most
        ``limit`` bytes (a namespace's quota: another's blocks are never touched); the keys
        removed."""
        ...

    def usage(self) -> SharedUsage | None:
        """What the tier holds now; None when it cannot be reached."""
        ...

    def probe(self) -> bool:
        """Try the tier now (after a failure); returns whether it answered."""
        ...

    def close(self) -> None: ...
