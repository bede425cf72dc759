"""The metadata store on a real PostgreSQL server shared by several instances: what one
writes, the others find; the server going away is a 503, never a half-kept change; an
unreachable server is named at open without its password."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from reliability.server import free_port
from reliability.services.postgres import PostgresServer

from semantic.adapters.storage.sql_metadata import SqlMetadataStore
from semantic.domain.errors import StorageUnavailableError
from semantic.ports.metadata_store import AgentRecord, BlockRecord, MessageRecord


def record(key: str, parent: str = "root") -> BlockRecord:
    return BlockRecord(key, parent, "default", (1, 2, 3), 100, "sum")


async def test_blocks_one_instance_saves_are_found_by_another(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """No in-memory copy of the blocks table on a shared database: a lookup in instance B
    finds what A saved after B opened, and stops finding what A's deletion dropped."""
    url = postgres.create_database("shared_lookups")
    a, b = SqlMetadataStore(tmp_path / "a.db", url), SqlMetadataStore(tmp_path / "b.db", url)
    await a.open()
    await b.open()
    assert await b.blocks(["k1"]) == {}
    await a.save_agent_blocks(
        AgentRecord("default", "x", ("k1", "k2"), 6), [record("k1"), record("k2", "k1")]
    )
    assert set(await b.blocks(["k1", "k2", "k3"])) == {"k1", "k2"}
    assert [r.key for r in await b.children("k1")] == ["k2"]
    assert (await b.blocks(["k2"]))["k2"].tokens == (1, 2, 3)
    assert sorted(await a.delete_agent("default", "x")) == ["k1", "k2"]
    assert await b.blocks(["k1", "k2"]) == {}
    assert not (tmp_path / "a.db").exists(), "no SQLite file beside a database URL"
    await a.close()
    await b.close()


async def test_instances_starting_together_on_a_new_database_take_turns_creating_it(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """PostgreSQL's advisory lock between processes; in one process (here) also a lock of
    Alembic's own, whose proxies are process-wide: a SQLite store opens beside them."""
    url = postgres.create_database("started_together")
    stores = [SqlMetadataStore(tmp_path / f"{i}.db", url) for i in range(3)]
    embedded = SqlMetadataStore(tmp_path / "embedded.db")
    await asyncio.gather(embedded.open(), *(store.open() for store in stores))
    assert sorted(store.created for store in stores) == [False, False, True]
    assert embedded.created
    for store in [*stores, embedded]:
        await store.close()


async def test_postgresql_going_away_is_unavailable_then_comes_back_intact(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """The run's own server is stopped (fast shutdown, sessions cut) and started again:
    meanwhile every call is ``StorageUnavailableError`` (503) and nothing of the turn that
    failed is kept; afterwards the same store works again on fresh connections."""
    url = postgres.create_database("goes_away")
    db = SqlMetadataStore(tmp_path / "semantic.db", url)
    await db.open()
    await db.append_messages("ns", "a", [MessageRecord("user", "hi")])
    postgres.stop()
    try:
        with pytest.raises(StorageUnavailableError, match="cannot be reached"):
            await db.append_messages("ns", "a", [MessageRecord("assistant", "lost")])
        with pytest.raises(StorageUnavailableError):
            await db.save_agent_blocks(AgentRecord("ns", "a", ("k1",), 3), [record("k1")])
    finally:
        postgres.start()
    assert [m.content for m in await db.messages("ns", "a")] == ["hi"]
    assert await db.agent("ns", "a") is None
    await db.append_messages("ns", "a", [MessageRecord("assistant", "hello")])
    assert [m.content for m in await db.messages("ns", "a")] == ["hi", "hello"]
    await db.close()


async def test_an_unreachable_database_is_named_at_open_without_its_password(
    tmp_path: Path,
) -> None:
    url = f"postgresql+asyncpg://semantic:s3cret@127.0.0.1:{free_port()}/semantic"
    db = SqlMetadataStore(tmp_path / "semantic.db", url)
    with pytest.raises(StorageUnavailableError) as refused:
        await db.open()
    message = str(refused.value)
    assert "s3cret" not in message
    assert f"postgresql+asyncpg://semantic:***@127.0.0.1:{url.split(':')[3]}" in message
