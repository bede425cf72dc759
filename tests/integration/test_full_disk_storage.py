"""Block files and the metadata store on a disk that fills: a real tmpfs (root mounts it;
elsewhere these tests are skipped, saying why)."""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from reliability.full_disk import MountRefusedError, fill, tmpfs

from semantic.adapters.mlx.kv.host_codec import MlxHostCodec
from semantic.adapters.storage.block_files import HEADROOM, BlockFiles
from semantic.adapters.storage.kv_block_store import KVBlockStore
from semantic.adapters.storage.sql_metadata import SqlMetadataStore
from semantic.domain.errors import DiskFullError
from semantic.ports.metadata_store import AgentRecord, MessageRecord
from tests.integration.test_storage import kv_blocks


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    try:
        with tmpfs(tmp_path / "disk", 8) as mounted:
            yield mounted
    except MountRefusedError as error:
        pytest.skip(f"no tmpfs can be mounted here ({error}); this needs root")


def free(path: Path) -> int:
    return shutil.disk_usage(path).free


def test_a_block_write_that_finds_the_disk_full_leaves_no_partial_file(disk: Path) -> None:
    store = KVBlockStore(BlockFiles(disk / "blocks"), MlxHostCodec())
    (disk / "blocks" / "ab").mkdir(parents=True)  # the write gets as far as its file
    fill(disk / "other-program")
    with pytest.raises(OSError, match="No space left") as failed:
        store.save("ab" * 32, kv_blocks(n_tokens=256))
    assert failed.value.errno == errno.ENOSPC
    assert list((disk / "blocks").rglob("*.tmp")) == []
    assert store.keys() == set()


def test_the_headroom_is_set_aside_given_up_and_taken_back_from_a_collected_block(
    disk: Path,
) -> None:
    files = BlockFiles(disk / "blocks")
    store = KVBlockStore(files, MlxHostCodec())
    assert files.keep_headroom(leaving=0)
    assert files.headroom_path.stat().st_size == HEADROOM
    assert files.release_space(headroom=True) >= HEADROOM
    assert not files.headroom_path.exists()
    store.save("cd" * 32, kv_blocks(n_tokens=400))  # 2.4 MB: more than the headroom
    fill(disk / "other-program")
    files.delete("cd" * 32)  # the block's file becomes the headroom: nobody can take it
    assert files.headroom_path.stat().st_size == HEADROOM
    assert free(disk) > 0
    assert store.keys() == set()


async def test_a_full_disk_is_a_disk_full_error_naming_the_directory_until_space_returns(
    disk: Path,
) -> None:
    metadata = SqlMetadataStore(disk / "data" / "semantic.db")
    await metadata.open()
    try:
        await metadata.create_agent(AgentRecord("default", "a"))
        fill(disk / "other-program")
        big = [MessageRecord("user", "x" * (1 << 20))]  # more pages than any slack
        with pytest.raises(DiskFullError, match=str(disk / "data")):
            await metadata.append_messages("default", "a", big)
        assert await metadata.messages("default", "a") == []
        (disk / "other-program").unlink()
        await metadata.append_messages("default", "a", big)
        assert len(await metadata.messages("default", "a")) == 1
    finally:
        await metadata.close()
