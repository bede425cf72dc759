"""The stored objects (``ObjectStore``) in the metadata database's ``api_objects`` table."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.engine import Row

from semantic.adapters.storage.lease_fence import check_lease
from semantic.adapters.storage.schema import api_objects
from semantic.adapters.storage.sql_engines import upsert
from semantic.adapters.storage.sql_metadata import SqlMetadataStore, unavailable_on_failure
from semantic.adapters.storage.sql_metadata.warm_up import NOBODY
from semantic.ports.leases import Lease
from semantic.ports.object_store import StoredObject


class SqliteObjectStore:
    """Shares the metadata store's database (opened and migrated by it)."""

    def __init__(self, metadata: SqlMetadataStore) -> None:
        self._metadata = metadata
        self.path: Path = metadata.path

    @unavailable_on_failure
    async def put_objects(
        self, namespace: str, objects: Sequence[StoredObject], *, lease: Lease | None = None
    ) -> None:
        now = time.time()
        async with self._metadata.engine().begin() as connection:
            await check_lease(connection, lease)
            for stored in objects:
                row = {
                    "namespace": namespace,
                    "kind": stored.kind,
                    "object_id": stored.object_id,
                    "parent_id": stored.parent_id,
                    "body": stored.body,
                    "created_at": stored.created_at or now,
                }
                await connection.execute(
                    upsert(connection, api_objects)
                    .values(**row)
                    .on_conflict_do_update(
                        index_elements=["namespace", "kind", "object_id"],
                        set_={"body": stored.body},
                    )
                )

    async def warm_up(self) -> None:
        """Run the read a chain's next turn starts with once, finding nothing: its first
        run compiles it (``sql_metadata.warm_up``)."""
        await self.stored_object(NOBODY, NOBODY, NOBODY)

    @unavailable_on_failure
    async def stored_object(self, namespace: str, kind: str, object_id: str) -> StoredObject | None:
        async with self._metadata.engine().connect() as connection:
            rows = await connection.execute(
                select(api_objects).where(
                    api_objects.c.namespace == namespace,
                    api_objects.c.kind == kind,
                    api_objects.c.object_id == object_id,
                )
            )
            row = rows.first()
            return None if row is None else _stored(row)

    @unavailable_on_failure
    async def object_children(
        self, namespace: str, kind: str, parent_id: str
    ) -> list[StoredObject]:
        async with self._metadata.engine().connect() as connection:
            rows = await connection.execute(
                select(api_objects)
                .where(
                    api_objects.c.namespace == namespace,
                    api_objects.c.kind == kind,
                    api_objects.c.parent_id == parent_id,
                )
                .order_by(api_objects.c.seq)
            )
            return [_stored(row) for row in rows]

    @unavailable_on_failure
    async def objects_of_kind(self, namespace: str, kind: str) -> list[StoredObject]:
        async with self._metadata.engine().connect() as connection:
            rows = await connection.execute(
                select(api_objects)
                .where(api_objects.c.namespace == namespace, api_objects.c.kind == kind)
                .order_by(api_objects.c.seq)
            )
            return [_stored(row) for row in rows]

    @unavailable_on_failure
    async def delete_objects(self, namespace: str, kind: str, object_ids: Sequence[str]) -> int:
        async with self._metadata.engine().begin() as connection:
            found = await connection.execute(
                delete(api_objects).where(
                    api_objects.c.namespace == namespace,
                    api_objects.c.kind == kind,
                    api_objects.c.object_id.in_(list(object_ids)),
                )
            )
            await connection.execute(
                delete(api_objects).where(
                    api_objects.c.namespace == namespace,
                    api_objects.c.kind != kind,
                    api_objects.c.parent_id.in_(list(object_ids)),
                )
            )
            return int(found.rowcount or 0)


def _stored(row: Row[Any]) -> StoredObject:
    return StoredObject(row.kind, row.object_id, row.body, row.parent_id, row.created_at)
