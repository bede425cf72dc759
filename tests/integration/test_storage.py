"""Block files and the SQLite metadata store, for real: files on disk, a real database."""

from __future__ import annotations

import contextlib
import sqlite3
from array import array
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load as safetensors_load
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from semantic.adapters.mlx.errors import UnsupportedModelError
from semantic.adapters.mlx.kv.host_codec import MlxHostCodec, check_at_rest
from semantic.adapters.mlx.kv.kv_payloads import MlxKV, StackedKV, kv_arrays
from semantic.adapters.mlx.kv.restore_buffers import RestoreBuffers
from semantic.adapters.storage.block_files import SPARES, BlockFiles
from semantic.adapters.storage.kv_block_store import KVBlockStore
from semantic.adapters.storage.safetensors_layout import safetensors_parts
from semantic.adapters.storage.schema_migrations import head
from semantic.adapters.storage.sql_metadata import SqlMetadataStore
from semantic.adapters.storage.sqlite_objects import SqliteObjectStore
from semantic.domain.blocks import KVBlock
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.errors import (
    AgentExistsError,
    CacheCorruptionError,
    DataDirectoryUnusableError,
    StorageUnavailableError,
)
from semantic.ports.metadata_store import AgentRecord, BlockRecord, MessageRecord
from tests.integration.legacy_schema import old_database

StoreFactory = Callable[[], SqlMetadataStore]


def kv_blocks(
    dtype: mx.Dtype = mx.float32, n_tokens: int = 256, head_dim: int = 64
) -> list[KVBlock]:
    return [
        KVBlock(
            layer,
            layer,
            0,
            n_tokens,
            MlxKV(
                mx.random.normal((1, 3, n_tokens, head_dim)).astype(dtype),
                mx.random.normal((1, 3, n_tokens, head_dim)).astype(dtype),
            ),
        )
        for layer in range(4)
    ]


@pytest.fixture
def store(tmp_path: Path) -> KVBlockStore:
    return KVBlockStore(BlockFiles(tmp_path / "blocks"), MlxHostCodec())


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_a_block_round_trips_bit_exactly(store: KVBlockStore, dtype: mx.Dtype) -> None:
    blocks = kv_blocks(dtype, n_tokens=100)
    stored = store.save("ab" * 32, blocks)
    loaded = store.load("ab" * 32, stored.checksum)
    assert [(p.layer, p.start, p.n_tokens) for p in loaded] == [(b.layer, 0, 100) for b in blocks]
    for original, payload in zip(blocks, loaded, strict=True):
        a_keys, a_values = kv_arrays(original.payload)
        b_keys, b_values = kv_arrays(payload.data)
        assert b_keys.dtype == dtype
        assert b_keys.shape == a_keys.shape
        assert mx.array_equal(a_keys, b_keys).item()
        assert mx.array_equal(a_values, b_values).item()


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_a_block_read_back_saves_to_the_same_bytes(store: KVBlockStore, dtype: mx.Dtype) -> None:
    stored = store.save("ab" * 32, kv_blocks(dtype))
    loaded = store.load("ab" * 32, stored.checksum)
    assert all(isinstance(p.data, StackedKV) for p in loaded)  # float32: saved from the buffer
    again = [KVBlock(p.layer, p.layer, 0, p.n_tokens, p.data, p.start) for p in loaded]
    assert store.save("cd" * 32, again) == stored


def test_a_restore_buffer_is_reused_only_once_nothing_views_it(tmp_path: Path) -> None:
    buffers = RestoreBuffers(max_bytes=1 << 30)
    store = KVBlockStore(BlockFiles(tmp_path / "blocks"), MlxHostCodec(buffers=buffers))
    first, second = kv_blocks(), kv_blocks()
    first_file, second_file = store.save("aa" * 32, first), store.save("bb" * 32, second)
    held = store.load("aa" * 32, first_file.checksum)
    dropped = store.load("bb" * 32, second_file.checksum)
    assert buffers.kept_bytes == 0  # both still viewed
    del dropped
    kept = buffers.kept_bytes
    assert kept > 0
    again = store.load("bb" * 32, second_file.checksum)  # lands in the recycled buffer
    assert buffers.kept_bytes == 0
    for blocks, payloads in ((first, held), (second, again)):
        for original, payload in zip(blocks, payloads, strict=True):
            a_keys, a_values = kv_arrays(original.payload)
            b_keys, b_values = kv_arrays(payload.data)
            assert mx.array_equal(a_keys, b_keys).item()
            assert mx.array_equal(a_values, b_values).item()


def test_partial_blocks_make_room_for_a_whole_one_past_a_quarter_of_the_cap() -> None:
    buffers = RestoreBuffers(max_bytes=300)
    for _ in range(3):  # partial blocks' odd sizes fill the cap...
        buffers.give_back(mx.zeros((100,), dtype=mx.uint8))
    buffers.give_back(mx.zeros((200,), dtype=mx.uint8))  # ...and a whole block still fits
    assert buffers.kept_bytes == 300
    assert buffers.take(200).nbytes == 200
    assert buffers.kept_bytes == 100


def test_a_restores_partial_block_keeps_its_buffer_beside_a_full_reserve() -> None:
    buffers = RestoreBuffers(max_bytes=600)
    assert buffers.reserve(200, 3) == 3
    whole = [buffers.take(200), buffers.take(200)]
    tail = mx.zeros((100,), dtype=mx.uint8)
    for buffer in (tail, *whole):  # a restore's blocks come back in any order
        buffers.give_back(buffer)
    assert buffers.kept_bytes == 500
    assert buffers.take(100) is tail, "the next restore of that tail reads into it unzeroed"


def test_odd_sizes_of_many_conversations_never_crowd_out_whole_blocks() -> None:
    buffers = RestoreBuffers(max_bytes=1000)
    assert buffers.reserve(100, 10) == 10
    for size in range(51, 71):  # twenty conversations' partial blocks come back
        buffers.give_back(mx.zeros((size,), dtype=mx.uint8))
    assert buffers.kept_bytes <= 1000
    whole = 0
    while True:  # count the whole-block buffers still kept
        before = buffers.kept_bytes
        buffers.take(100)
        if buffers.kept_bytes == before:
            break
        whole += 1
    assert whole >= 7, "odd sizes may take at most about a quarter of the cap"


@pytest.mark.parametrize(
    ("at_rest", "bits", "smaller", "head_dim"),
    [("q8", 8, 3.4, 64), ("q4", 4, 6.0, 64), ("q8", 8, 3.0, 96), ("q4", 4, 4.5, 96)],
)
def test_quantized_at_rest_is_smaller_and_within_one_step(
    tmp_path: Path, at_rest: str, bits: int, smaller: float, head_dim: int
) -> None:
    """Heads of 96 values (Phi-3) are quantized in groups of 32."""
    blocks = kv_blocks(mx.float32, n_tokens=256, head_dim=head_dim)
    exact = KVBlockStore(BlockFiles(tmp_path / "exact"), MlxHostCodec())
    lossy = KVBlockStore(BlockFiles(tmp_path / at_rest), MlxHostCodec(at_rest))
    stored = lossy.save("ab" * 32, blocks)
    assert exact.save("ab" * 32, blocks).nbytes / stored.nbytes > smaller
    loaded = lossy.load("ab" * 32, stored.checksum)
    for original, payload in zip(blocks, loaded, strict=True):
        a, b = original.payload, payload.data
        assert isinstance(a, MlxKV)
        assert isinstance(b, MlxKV)
        assert b.keys.dtype == mx.float32
        assert b.keys.shape == a.keys.shape
        step = (mx.max(a.keys) - mx.min(a.keys)) / (2**bits - 1)  # the widest group's step
        assert mx.all(mx.abs(a.keys - b.keys) <= step).item()


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_block_files_are_safetensors_the_library_reads(
    store: KVBlockStore, tmp_path: Path, dtype: mx.Dtype
) -> None:
    key = "fe" * 32
    blocks = kv_blocks(dtype, n_tokens=100)
    store.save(key, blocks)
    path = tmp_path / "blocks" / key[:2] / f"{key}.safetensors"
    read = safetensors_load(path.read_bytes())
    with safe_open(str(path), framework="numpy") as opened:
        metadata = opened.metadata()
    assert metadata["layers"] == ",".join(f"{layer}:0:100" for layer in range(4))
    for block in blocks:
        keys, _ = kv_arrays(block.payload)
        as_bits = keys.view(mx.uint16) if dtype == mx.bfloat16 else keys
        assert np.array_equal(read[f"{block.layer}.keys"], np.asarray(as_bits)[0])


def test_the_writer_keeps_odd_shapes_and_refuses_foreign_byte_order() -> None:
    tensors = {
        "empty": np.zeros((0, 3), np.float32),
        "scalar": np.full((), 3.0, np.float32),
        "strided": np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2],
    }
    read = safetensors_load(b"".join(bytes(p) for p in safetensors_parts(tensors, {})))
    for name, tensor in tensors.items():
        assert read[name].shape == tensor.shape
        assert np.array_equal(read[name], tensor)
    with pytest.raises(ValueError, match="byte order"):
        safetensors_parts({"swapped": np.ones(3, dtype=">f4")}, {})


@pytest.mark.parametrize("at_rest", ["lossless", "q8"])
def test_saving_a_stored_block_again_returns_the_checksum_its_file_has(
    tmp_path: Path, at_rest: str
) -> None:
    store = KVBlockStore(BlockFiles(tmp_path / "blocks"), MlxHostCodec(at_rest))
    blocks = kv_blocks()
    first = store.save("ab" * 32, blocks)
    for _ in range(3):  # the file on disk is kept, and its own checksum comes back
        assert store.save("ab" * 32, blocks) == first
    assert len(store.load("ab" * 32, first.checksum)) == len(blocks)


@pytest.mark.parametrize("at_rest", ["q8", "q4"])
def test_a_head_size_no_group_divides_is_refused_at_start(at_rest: str) -> None:
    with pytest.raises(UnsupportedModelError, match=r"80 values.*lossless"):
        check_at_rest(at_rest, head_spec(80))
    check_at_rest("lossless", head_spec(80))
    check_at_rest(at_rest, head_spec(96))


def head_spec(head_dim: int) -> ModelCacheSpec:
    return ModelCacheSpec(1, 1, head_dim, head_dim, "float32", (None,))


def test_a_file_in_another_at_rest_format_is_refused(tmp_path: Path) -> None:
    files = BlockFiles(tmp_path / "blocks")
    stored = KVBlockStore(files, MlxHostCodec("q8")).save("ab" * 32, kv_blocks())
    with pytest.raises(CacheCorruptionError):
        KVBlockStore(files, MlxHostCodec()).load("ab" * 32, stored.checksum)


def test_a_file_whose_metadata_does_not_describe_its_tensors_is_corrupt(tmp_path: Path) -> None:
    files = BlockFiles(tmp_path / "blocks")
    tensors = {
        "0.keys": np.zeros((3, 4, 8), np.float32),
        "0.values": np.ones((3, 4, 8), np.float32),
    }
    for layers in ("0:0", "1:0:4", "zero:0:4"):  # a field short, a layer not in the file, no int
        _, checksum = files.write("cd" * 32, tensors, {**GOOD_METADATA, "layers": layers})
        with pytest.raises(CacheCorruptionError, match="does not describe its KV"):
            KVBlockStore(files, MlxHostCodec()).load("cd" * 32, checksum)
        files.path("cd" * 32).unlink()


GOOD_METADATA = {"format": "semantic-kv-1", "dtype": "float32"}


@pytest.mark.parametrize("damage", ["flip data", "flip header", "truncate", "delete", "append"])
def test_damage_to_a_block_file_is_always_detected(
    store: KVBlockStore, tmp_path: Path, damage: str
) -> None:
    key = "cd" * 32
    stored = store.save(key, kv_blocks())
    path = tmp_path / "blocks" / key[:2] / f"{key}.safetensors"
    data = bytearray(path.read_bytes())
    if damage == "flip data":
        data[-1000] ^= 0x01
    elif damage == "flip header":
        data[20] ^= 0x20
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "append":
        data += b"\0"
    if damage == "delete":
        path.unlink()
    else:
        path.write_bytes(bytes(data))
    with pytest.raises(CacheCorruptionError):
        store.load(key, stored.checksum)


def test_writes_leave_no_temporary_files_and_strays_are_removed(
    store: KVBlockStore, tmp_path: Path
) -> None:
    store.save("ef" * 32, kv_blocks())
    assert not list((tmp_path / "blocks").rglob("*.tmp"))
    (tmp_path / "blocks" / "ef" / "half-written.safetensors.123.tmp").write_bytes(b"x")
    assert store.remove_temporaries() == 1
    assert store.keys() == {"ef" * 32}


def test_quarantine_moves_the_file_aside(store: KVBlockStore, tmp_path: Path) -> None:
    store.save("aa" * 32, kv_blocks())
    store.quarantine("aa" * 32)
    assert store.keys() == set()
    assert len(list((tmp_path / "quarantine").iterdir())) == 1


def test_a_file_that_cannot_go_into_quarantine_is_deleted(
    store: KVBlockStore, tmp_path: Path
) -> None:
    """``blocks/`` on another filesystem, or a quarantine that cannot be written: the bad
    file must still never be read as good (QA pass 6: a 500 on every turn before)."""
    (tmp_path / "quarantine").write_text("not a directory")
    store.save("aa" * 32, kv_blocks())
    store.quarantine("aa" * 32)
    assert store.keys() == set()


def record(key: str, parent: str = "root", tokens: tuple[int, ...] = (1, 2, 3)) -> BlockRecord:
    return BlockRecord(key, parent, "default", tokens, 100, "sum")


async def test_the_metadata_schema_is_created_in_wal_mode_and_reopens(tmp_path: Path) -> None:
    db = SqlMetadataStore(tmp_path / "semantic.db")
    await db.open()
    created = db.created
    await db.close()
    await db.open()
    assert (created, db.created) == (True, False), "created once, then opened"
    await db.close()
    with sqlite3.connect(tmp_path / "semantic.db") as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("SELECT version_num FROM alembic_version").fetchall() == [(head(),)]
        version = raw.execute("SELECT max(version) FROM schema_version").fetchone()[0]
        assert version == 6, "releases from before Alembic refuse it (they knew up to 5)"


async def test_a_data_directory_with_files_where_its_parts_belong_is_named(
    tmp_path: Path,
) -> None:
    """Refused at start with what is wrong (QA pass 6: a healthy server whose every save
    failed, or a raw SQLAlchemy error)."""
    (tmp_path / "blocks").write_text("not a directory")
    with pytest.raises(DataDirectoryUnusableError, match="blocks is a file"):
        BlockFiles(tmp_path / "blocks")
    (tmp_path / "semantic.db").write_bytes(b"not a database, just bytes" * 100)
    with pytest.raises(DataDirectoryUnusableError, match="cannot be read"):
        await SqlMetadataStore(tmp_path / "semantic.db").open()


async def test_reference_counts_follow_agents_and_orphans_are_returned(
    new_store: StoreFactory,
) -> None:
    db = new_store()
    await db.open()
    shared, only_a, only_b = record("k1"), record("k2", "k1"), record("k3", "k1", (4, 5))
    await db.save_agent_blocks(AgentRecord("default", "a", ("k1", "k2"), 6), [shared, only_a])
    await db.save_agent_blocks(AgentRecord("default", "b", ("k1", "k3"), 6), [only_b])
    rows = await db.blocks(["k1", "k2", "k3"])
    assert {k: r.ref_count for k, r in rows.items()} == {"k1": 2, "k2": 1, "k3": 1}
    assert rows["k3"].tokens == (4, 5)
    assert [r.key for r in await db.children("k1")] in (["k2", "k3"], ["k3", "k2"])
    assert await db.delete_agent("default", "a") == ["k2"]
    assert await db.all_block_keys() == {"k1", "k3"}
    await db.close()


async def test_transcripts_and_agents_persist(new_store: StoreFactory) -> None:
    db = new_store()
    await db.open()
    await db.create_agent(
        AgentRecord("ns", "helper", system_prompt="Be brief.", keeps_transcript=True)
    )
    with pytest.raises(AgentExistsError):
        await db.create_agent(AgentRecord("ns", "helper"))
    await db.append_messages(
        "ns", "helper", [MessageRecord("user", "hi"), MessageRecord("assistant", "hello")]
    )
    await db.close()
    again = new_store()
    await again.open()
    agent = await again.agent("ns", "helper")
    assert agent is not None
    assert agent.system_prompt == "Be brief."
    assert [(m.role, m.content) for m in await again.messages("ns", "helper")] == [
        ("user", "hi"),
        ("assistant", "hello"),
    ]
    assert await again.message_counts("ns") == {"helper": 2}
    assert agent.keeps_transcript
    await again.save_agent_blocks(AgentRecord("ns", "plain", token_count=3), [])
    plain = await again.agent("ns", "plain")
    assert plain is not None
    assert not plain.keeps_transcript
    await again.save_agent_blocks(AgentRecord("ns", "helper", token_count=3), [])
    helper = await again.agent("ns", "helper")
    assert helper is not None
    assert helper.keeps_transcript, "a save keeps what the agent is"
    await again.close()


async def test_a_version_1_database_learns_which_agents_keep_transcripts(tmp_path: Path) -> None:
    """Before version 2 an agents-API agent was known by its messages or system prompt."""
    with contextlib.closing(old_database(tmp_path / "semantic.db", 1)) as raw:
        rows = [("talked", None), ("prompted", "Be brief."), ("plain", None)]
        for agent_id, prompt in rows:
            raw.execute(
                "INSERT INTO agents (namespace, agent_id, system_prompt, created_at, last_used)"
                " VALUES ('ns', ?, ?, 0, 0)",
                (agent_id, prompt),
            )
        raw.execute(
            "INSERT INTO messages (namespace, agent_id, role, content, created_at)"
            " VALUES ('ns', 'talked', 'user', 'hi', 0)"
        )
        raw.commit()
    db = SqlMetadataStore(tmp_path / "semantic.db")
    await db.open()
    assert not db.created
    kept = {a.agent_id: a.keeps_transcript for a in await db.agents("ns")}
    await db.close()
    assert kept == {"talked": True, "prompted": True, "plain": False}


async def test_a_version_4_database_upgrades_in_place_keeping_its_data(tmp_path: Path) -> None:
    """A data directory from the release before Alembic: its rows survive the upgrade to
    the newest revision, and the store writes the tables that version lacked."""
    with contextlib.closing(old_database(tmp_path / "semantic.db", 4)) as raw:
        raw.execute(
            "INSERT INTO agents (namespace, agent_id, token_count, created_at, last_used,"
            " keeps_transcript) VALUES ('ns', 'a', 3, 1.5, 2.5, 1)"
        )
        raw.execute(
            "INSERT INTO blocks (key, parent_key, namespace, n_tokens, tokens, nbytes,"
            " checksum, ref_count, created_at) VALUES ('k1', 'root', 'ns', 3, ?, 100, 's', 1, 0)",
            (array("I", (1, 2, 3)).tobytes(),),
        )
        raw.execute("INSERT INTO agent_blocks VALUES ('ns', 'a', 0, 'k1')")
        raw.execute(
            "INSERT INTO messages (namespace, agent_id, role, content, created_at, tool_calls)"
            " VALUES ('ns', 'a', 'assistant', 'hello', 0, '[]')"
        )
        raw.execute(
            "INSERT INTO api_objects (namespace, kind, object_id, body, created_at)"
            " VALUES ('ns', 'response', 'resp_1', '{}', 0)"
        )
        raw.commit()
    db = SqlMetadataStore(tmp_path / "semantic.db")
    await db.open()
    assert not db.created, "an old database is upgraded, not taken for a new one"
    agent = await db.agent("ns", "a")
    assert agent is not None
    assert (agent.block_keys, agent.token_count, agent.keeps_transcript) == (("k1",), 3, True)
    assert (await db.blocks(["k1"]))["k1"].tokens == (1, 2, 3)
    assert [(m.content, m.tool_calls) for m in await db.messages("ns", "a")] == [("hello", "[]")]
    objects = SqliteObjectStore(db)
    assert await objects.stored_object("ns", "response", "resp_1") is not None
    await db.save_agent_blocks(AgentRecord("ns", "a", ("k1", "k2"), 6), [record("k2", "k1")])
    await db.close()
    with sqlite3.connect(tmp_path / "semantic.db") as raw:
        assert raw.execute("SELECT version_num FROM alembic_version").fetchall() == [(head(),)]
        assert raw.execute("SELECT key, shared FROM blocks ORDER BY key").fetchall() == [
            ("k1", 0),
            ("k2", 0),
        ]
        assert raw.execute("SELECT count(*) FROM agent_leases").fetchone() == (0,)


async def test_an_upgrade_that_fails_part_way_leaves_the_database_as_it_was(
    tmp_path: Path,
) -> None:
    """All revisions run in one transaction (on SQLite too, whose driver would commit each
    DDL statement alone): the last one failing undoes the ones before it."""
    with contextlib.closing(old_database(tmp_path / "semantic.db", 3)) as raw:
        raw.execute("CREATE TABLE agent_leases (squatter TEXT)")  # revision 0005 will fail
        raw.commit()
    with pytest.raises(OperationalError, match="agent_leases already exists"):
        await SqlMetadataStore(tmp_path / "semantic.db").open()
    with sqlite3.connect(tmp_path / "semantic.db") as raw:
        tables = {row[0] for row in raw.execute("SELECT name FROM sqlite_master")}
        assert "api_objects" not in tables, "revision 0004 was undone with 0005"
        assert "alembic_version" not in tables
        assert raw.execute("SELECT max(version) FROM schema_version").fetchone() == (3,)


@pytest.mark.parametrize("newer", ["schema_version 7", "revision ffff"])
async def test_a_database_from_a_newer_release_is_refused_untouched(
    tmp_path: Path, newer: str
) -> None:
    with contextlib.closing(old_database(tmp_path / "semantic.db", 5)) as raw:
        if newer == "schema_version 7":
            raw.execute("INSERT INTO schema_version (version) VALUES (7)")
        else:
            raw.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
            raw.execute("INSERT INTO alembic_version VALUES ('ffff')")
        raw.commit()
    with pytest.raises(DataDirectoryUnusableError, match="newer"):
        await SqlMetadataStore(tmp_path / "semantic.db").open()
    with sqlite3.connect(tmp_path / "semantic.db") as raw:
        tables = {row[0] for row in raw.execute("SELECT name FROM sqlite_master")}
        assert newer == "revision ffff" or "alembic_version" not in tables


async def test_a_full_disk_is_storage_unavailable_and_keeps_nothing_half_done(
    tmp_path: Path,
) -> None:
    """SQLite's own failure, not a fake: the database may grow no further (as on a full
    disk), so appending a long message fails inside the transaction."""
    db = SqlMetadataStore(tmp_path / "semantic.db")
    await db.open()
    await db.create_agent(AgentRecord("ns", "helper"))
    await db.append_messages("ns", "helper", [MessageRecord("user", "hi")])
    engine = db._db()  # noqa: SLF001 - every connection of the store's own pool
    pages = sqlite3.connect(tmp_path / "semantic.db").execute("PRAGMA page_count").fetchone()[0]

    def no_growth(connection: sqlite3.Connection, _: object) -> None:
        connection.execute(f"PRAGMA max_page_count={pages}")

    event.listen(engine.sync_engine, "connect", no_growth)
    await engine.dispose()  # the next connections are made with the limit
    with pytest.raises(StorageUnavailableError, match="full"):
        await db.append_messages("ns", "helper", [MessageRecord("assistant", "x" * 100_000)])
    assert [m.content for m in await db.messages("ns", "helper")] == ["hi"]
    await db.close()


async def test_a_change_that_rolls_back_leaves_the_lookups_as_they_were(
    new_store: StoreFactory,
) -> None:
    """The lookups' in-memory copy drops an orphaned block before the commit; a commit that
    fails (as a disk I/O error would fail it) puts it back."""
    db = new_store()
    await db.open()
    await db.save_agent_blocks(AgentRecord("default", "a", ("k1",), 3), [record("k1")])

    def disk_error(_: object) -> None:
        raise OperationalError("COMMIT", {}, sqlite3.OperationalError("disk I/O error"))

    event.listen(db._db().sync_engine, "commit", disk_error)  # noqa: SLF001 - its own engine
    with pytest.raises(StorageUnavailableError, match="disk I/O error"):
        await db.save_agent_blocks(AgentRecord("default", "a", ("k2",), 3), [record("k2")])
    event.remove(db._db().sync_engine, "commit", disk_error)  # noqa: SLF001
    assert set(await db.blocks(["k1", "k2"])) == {"k1"}, "k1 is still found, k2 never was"
    assert await db.all_block_keys() == {"k1"}
    await db.close()


async def test_anonymous_agents_are_found_by_the_block_they_end_with(
    new_store: StoreFactory,
) -> None:
    db = new_store()
    await db.open()
    rows = [record("k1"), record("k2", "k1"), record("k3", "k2")]
    await db.save_agent_blocks(
        AgentRecord("default", "~anon-a", ("k1", "k2"), 6, anonymous=True), rows[:2]
    )
    await db.save_agent_blocks(
        AgentRecord("default", "~anon-b", ("k1", "k2", "k3"), 9, anonymous=True), rows[2:]
    )
    await db.save_agent_blocks(AgentRecord("default", "named", ("k1", "k2"), 6), [])
    await db.save_agent_blocks(AgentRecord("other", "~anon-c", ("k1", "k2"), 6, anonymous=True), [])
    found = await db.anonymous_agents_ending_at("default", ["k1", "k2"])
    assert [(a.agent_id, a.block_keys) for a in found] == [("~anon-a", ("k1", "k2"))]
    assert [a.agent_id for a in await db.anonymous_agents_ending_at("default", ["k3"])] == [
        "~anon-b"
    ]
    await db.close()


async def test_a_quarantined_block_is_replaced_by_the_next_save(new_store: StoreFactory) -> None:
    db = new_store()
    await db.open()
    await db.save_agent_blocks(AgentRecord("default", "a", ("k1",), 3), [record("k1")])
    await db.quarantine_block("k1")
    assert (await db.blocks(["k1"]))["k1"].quarantined
    fresh = BlockRecord("k1", "root", "default", (1, 2, 3), 100, "new-sum")
    await db.save_agent_blocks(AgentRecord("default", "a", ("k1",), 3), [fresh])
    row = (await db.blocks(["k1"]))["k1"]
    assert not row.quarantined
    assert row.checksum == "new-sum"
    await db.close()


async def test_lookups_answer_from_memory_exactly_as_the_table_would(
    new_store: StoreFactory,
) -> None:
    """Block lookups come from a copy of the table kept in memory; after every kind of change
    a store opened afresh on the same file (which reads the table) must agree with it."""
    db = new_store()
    await db.open()
    keys = ["k1", "k2", "k3", "k4"]

    async def agrees() -> None:
        fresh = new_store()
        await fresh.open()
        assert await db.blocks(keys) == await fresh.blocks(keys)
        for parent in ("root", "k1"):
            assert await db.children(parent) == await fresh.children(parent)
        await fresh.close()

    await db.save_agent_blocks(AgentRecord("default", "a", ("k1",), 3), [record("k1")])
    await db.save_agent_blocks(AgentRecord("default", "a", ("k1", "k2"), 6), [record("k2", "k1")])
    await db.save_agent_blocks(AgentRecord("default", "b", ("k1", "k3"), 6), [record("k3", "k1")])
    await agrees()
    assert (await db.blocks(["k1"]))["k1"].ref_count == 2
    await db.quarantine_block("k3")
    await agrees()
    assert await db.delete_agent("default", "a") == ["k2"]
    await agrees()
    assert [r.key for r in await db.children("k1")] == ["k3"]
    await db.save_agent_blocks(AgentRecord("default", "b", ("k4",), 3), [record("k4")])
    await agrees()
    assert set(await db.blocks(keys)) == {"k4"}, "k1 and k3 lost their last agent"
    assert await db.delete_agent("default", "b") == ["k4"]
    await agrees()
    assert await db.blocks(keys) == {}
    await db.close()


def test_deleted_files_are_written_over_by_later_blocks_and_read_back_exactly(
    tmp_path: Path,
) -> None:
    files = BlockFiles(tmp_path / "blocks")
    big = {"x": np.arange(4096, dtype=np.float32)}
    small = {"x": np.arange(100, dtype=np.float32) * 3}
    keys = [f"{i:02x}" * 32 for i in range(SPARES + 2)]
    for key in keys:
        files.write(key, big, {})
    for key in keys:
        files.delete(key)
    assert files.keys() == set()
    assert len(list(files.spare_dir.iterdir())) == SPARES  # the rest are gone
    spare_inodes = {path.stat().st_ino for path in files.spare_dir.iterdir()}
    again = BlockFiles(tmp_path / "blocks")  # a restart finds the spares
    size, checksum = again.write("ab" * 32, small, {"kind": "small"})
    assert again.path("ab" * 32).stat().st_size == size
    assert len(list(again.spare_dir.iterdir())) == SPARES - 1
    data, spans, metadata = again.read("ab" * 32, checksum, lambda n: np.empty(n, np.uint8))
    span = spans["x"]
    assert np.array_equal(data[span.begin : span.end].view(np.float32), small["x"])
    assert metadata == {"kind": "small"}
    assert again.path("ab" * 32).stat().st_ino in spare_inodes  # written over, not new
    assert not list((tmp_path / "blocks").rglob("*.tmp"))


async def test_a_cut_does_not_bring_back_an_agent_deleted_since_it_was_read(
    new_store: StoreFactory,
) -> None:
    """The quota pass reads every record, then cuts them one by one; a record deleted in
    between stays deleted."""
    db = new_store()
    await db.open()
    await db.save_agent_blocks(AgentRecord("default", "a", ("k1",), 3), [record("k1")])
    await db.save_agent_blocks(AgentRecord("default", "a", ("k1", "k2"), 6), [record("k2", "k1")])
    assert set(await db.delete_agent("default", "a")) == {"k1", "k2"}
    cut = AgentRecord("default", "a", ("k1",), 3)
    assert await db.save_agent_blocks(cut, [], expected=("k1", "k2")) == []
    assert await db.agent("default", "a") is None
    assert await db.blocks(["k1", "k2"]) == {}
    await db.close()


async def test_a_block_list_naming_a_block_cut_meanwhile_is_refused_as_unavailable(
    new_store: StoreFactory,
) -> None:
    """A fork copies a block list read earlier; if the disk quota cut one of those blocks in
    between, the change is refused as the storage's (503, try again), not a 500."""
    db = new_store()
    await db.open()
    await db.save_agent_blocks(AgentRecord("default", "a", ("k1",), 3), [record("k1")])
    with pytest.raises(StorageUnavailableError, match="raced another"):
        await db.save_agent_blocks(AgentRecord("default", "fork", ("k1", "gone"), 6), [])
    assert await db.agent("default", "fork") is None
    assert (await db.blocks(["k1"]))["k1"].ref_count == 1
    await db.close()


async def test_a_fork_shares_the_blocks_and_copies_the_transcript_in_one_go(
    new_store: StoreFactory,
) -> None:
    db = new_store()
    await db.open()
    await db.save_agent_blocks(
        AgentRecord("default", "a", ("k1", "k2"), 6, "old rules"), [record("k1"), record("k2")]
    )
    said = [MessageRecord("user", "hi", 1.0), MessageRecord("assistant", "yo", 2.0, raw="yo!")]
    await db.append_messages("default", "a", said)
    fork = await db.fork_agent("default", "a", "b", "new rules")
    assert fork is not None
    assert (fork.block_keys, fork.token_count, fork.system_prompt) == (("k1", "k2"), 6, "new rules")
    assert fork.keeps_transcript
    assert fork.forked_from == "a"  # its lineage, for the dashboard
    assert await db.agent("default", "b") == fork
    assert await db.messages("default", "b") == said
    await db.append_messages("default", "b", [MessageRecord("user", "more", 3.0)])
    assert await db.messages("default", "a") == said  # the copies diverge
    assert {k: r.ref_count for k, r in (await db.blocks(["k1", "k2"])).items()} == {
        "k1": 2,
        "k2": 2,
    }
    with pytest.raises(AgentExistsError):
        await db.fork_agent("default", "a", "b", None)
    assert await db.fork_agent("default", "missing", "c", None) is None
    assert await db.fork_agent("elsewhere", "a", "c", None) is None
    assert await db.delete_agent("default", "a") == []  # the fork still holds both
    assert sorted(await db.delete_agent("default", "b")) == ["k1", "k2"]
    await db.close()


async def test_a_branch_commits_with_its_turn_sharing_the_blocks_still_stored(
    new_store: StoreFactory,
) -> None:
    """A response's agent is made with its reply (``commit_branch``): the source's block
    list read before generating, up to a block deleted since; a row the turn's save made
    first keeps its list and takes the system prompt and the transcript."""
    db = new_store()
    await db.open()
    await db.save_agent_blocks(
        AgentRecord("default", "a", ("k1", "k2"), 6, "old rules"), [record("k1"), record("k2")]
    )
    said = [MessageRecord("user", "hi", 1.0), MessageRecord("assistant", "yo", 2.0, raw="yo!")]
    branch = AgentRecord("default", "b", ("k1", "k2", "k3"), 6, "new rules")
    await db.commit_branch(branch, said)
    made = await db.agent("default", "b")
    assert made is not None
    assert (made.block_keys, made.token_count, made.system_prompt) == (("k1", "k2"), 6, "new rules")
    assert made.keeps_transcript
    assert not made.anonymous
    assert await db.messages("default", "b") == said
    assert {k: r.ref_count for k, r in (await db.blocks(["k1", "k2"])).items()} == {
        "k1": 2,
        "k2": 2,
    }
    saved = AgentRecord("default", "c", ("k1", "k3"), 9)  # its turn's save came first
    await db.save_agent_blocks(saved, [record("k3")])
    await db.commit_branch(AgentRecord("default", "c", ("k1",), 6, "rules"), said[:1])
    made = await db.agent("default", "c")
    assert made is not None
    assert (made.block_keys, made.token_count, made.system_prompt) == (("k1", "k3"), 9, "rules")
    assert made.keeps_transcript
    assert await db.messages("default", "c") == said[:1]
    assert (await db.blocks(["k1"]))["k1"].ref_count == 3
    await db.close()
