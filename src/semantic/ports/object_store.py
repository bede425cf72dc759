"""The stored objects port: the Responses API's responses, conversations and items, kept as
JSON documents in the metadata database beside the agents whose KV they resume from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from semantic.ports.leases import Lease


@dataclass(frozen=True, slots=True)
class StoredObject:
    kind: str
    """``response``, ``conversation``, ``item`` (a conversation's) or ``input_item``."""
    object_id: str
    body: str
    """The object as JSON."""
    parent_id: str = ""
    """An item's conversation or response."""
    created_at: float = 0.0


class ObjectStore(Protocol):
    """Objects of one namespace by kind and id; a parent's children in the order kept.
    ``put_objects`` is one transaction, so a response and its items commit together."""

    async def put_objects(
        self, namespace: str, objects: Sequence[StoredObject], *, lease: Lease | None = None
    ) -> None:
        """Insert, or replace the body of, each object (an id keeps its place). ``lease``:
        the objects belong to that agent's turn, and the write is refused
        (``LeaseLostError``) unless the lease is still current, checked in its
        transaction."""
        ...

    async def stored_object(
        self, namespace: str, kind: str, object_id: str
    ) -> StoredObject | None: ...

    async def object_children(
        self, namespace: str, kind: str, parent_id: str
    ) -> list[StoredObject]:
        """A parent's objects of ``kind``, oldest first."""
        ...

    async def objects_of_kind(self, namespace: str, kind: str) -> list[StoredObject]:
        """Every object of ``kind`` in the namespace, oldest first."""
        ...

    async def delete_objects(self, namespace: str, kind: str, object_ids: Sequence[str]) -> int:
        """Delete those objects and their children (of any kind); returns how many of the
        named ones there were."""
        ...
