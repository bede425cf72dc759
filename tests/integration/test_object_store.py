"""The Responses API's stored objects in the real metadata database (SQLite and PostgreSQL):
kept per namespace, children in order, deleted with their children, kept across a reopen."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from semantic.adapters.storage.sql_metadata import SqlMetadataStore
from semantic.adapters.storage.sqlite_objects import SqliteObjectStore
from semantic.ports.object_store import StoredObject

StoreFactory = Callable[[], SqlMetadataStore]


async def _objects(new_store: StoreFactory) -> tuple[SqlMetadataStore, SqliteObjectStore]:
    metadata = new_store()
    await metadata.open()
    return metadata, SqliteObjectStore(metadata)


def test_objects_are_kept_per_namespace_with_their_children(new_store: StoreFactory) -> None:
    async def run() -> None:
        metadata, objects = await _objects(new_store)
        conversation = StoredObject("conversation", "conv_1", '{"id": "conv_1"}')
        items = [StoredObject("item", f"msg_{i}", f'{{"n": {i}}}', "conv_1") for i in (3, 1, 2)]
        await objects.put_objects("ns", [conversation, *items])
        assert await objects.stored_object("other", "conversation", "conv_1") is None
        children = await objects.object_children("ns", "item", "conv_1")
        assert [c.object_id for c in children] == ["msg_3", "msg_1", "msg_2"]
        await objects.put_objects("ns", [StoredObject("item", "msg_3", '{"n": 9}', "conv_1")])
        children = await objects.object_children("ns", "item", "conv_1")
        assert (children[0].object_id, children[0].body) == ("msg_3", '{"n": 9}')
        await metadata.close()
        metadata, objects = await _objects(new_store)
        assert await objects.delete_objects("other", "conversation", ["conv_1"]) == 0
        assert await objects.delete_objects("ns", "conversation", ["conv_1"]) == 1
        assert await objects.object_children("ns", "item", "conv_1") == []
        assert await objects.stored_object("ns", "conversation", "conv_1") is None
        await metadata.close()

    asyncio.run(run())
