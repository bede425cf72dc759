"""A full disk costs cached KV before it costs a transcript (``DiskRoom``), on fakes whose
free space follows their files: blocks are 20 bytes, the headroom file 10."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

import pytest

from semantic.domain.errors import DiskFullError
from semantic.ports.metadata_store import MessageRecord
from tests.unit.storage_fakes import FakeBlockStore, FakeMetadataStore
from tests.unit.test_cache_store import SYSTEM, Harness, started


async def on_a_disk(capacity: int, *, floor: int = 5, reserve: int = 0) -> Harness:
    disk = FakeBlockStore()
    disk.capacity = capacity
    return await started(
        Harness(block_store=disk, metadata=FakeMetadataStore(disk), floor=floor, reserve=reserve)
    )


def transcript_write(h: Harness, agent: str, text: str) -> Callable[[], Awaitable[None]]:
    records = [MessageRecord("user", text)]
    return functools.partial(h.metadata.append_messages, "default", agent, records)


async def test_a_transcript_on_a_disk_another_program_filled_takes_the_blocks_room() -> None:
    h = await on_a_disk(1000)
    await h.ask([1, *SYSTEM[1:], 50], agent="a0")
    await h.ask([2, *SYSTEM[1:], 51], agent="a1")
    assert h.block_store.headroom == 10  # set aside at start
    h.block_store.taken = h.block_store.free_bytes() or 0  # another program takes the rest
    assert h.block_store.free_bytes() == 0
    await h.store.keeping("default", "a1", transcript_write(h, "a1", "kept"))
    assert [m.content for m in await h.metadata.messages("default", "a1")] == ["kept"]
    assert not h.metadata.agent_rows[("default", "a0")].block_keys  # the oldest went first
    assert h.store.stats.blocks_evicted >= 3
    assert set(h.block_store.files) == set(h.metadata.block_rows)
    assert h.store.disk.refused is None


async def test_with_nothing_of_ours_left_a_write_is_refused_then_kept_once_space_returns() -> None:
    """Another program takes whatever is free before each write: blocks go, then the
    headroom, then a write is refused, naming the disk, and keeps nothing."""
    h = await on_a_disk(1000)
    await h.ask([1, *SYSTEM[1:], 50], agent="a0")
    kept, refusal = [], ""
    for turn in range(10):
        h.block_store.taken += h.block_store.free_bytes() or 0
        try:
            await h.store.keeping("default", "a0", transcript_write(h, "a0", f"turn {turn}"))
        except DiskFullError as error:
            refusal = str(error)
            break
        kept.append(f"turn {turn}")
    assert "/fake is full" in refusal
    assert "nothing cached is left" in refusal
    assert [m.content for m in await h.metadata.messages("default", "a0")] == kept
    assert not h.metadata.block_rows  # every block of ours gave way first
    with pytest.raises(DiskFullError, match="/fake is full"):
        h.store.check_room()  # nothing freed since: refused before a reply is computed
    during = h.store.disk
    h.block_store.taken -= 1  # the other program lets go of a byte: worth a try
    h.store.check_room()
    h.block_store.taken = 0  # and of the rest: no restart needed
    after = h.store.disk
    assert during.refused is not None
    assert after.refused is None
    await h.store.keeping("default", "a0", transcript_write(h, "a0", "back"))
    assert [m.content for m in await h.metadata.messages("default", "a0")] == [*kept, "back"]


async def test_a_block_write_keeps_the_floor_and_a_failed_save_leaves_no_file() -> None:
    """Room for one block above the floor, not two: the save fails whole, its first file
    goes at once, and the KV stays in memory for the next turn."""
    h = await on_a_disk(10 + 5 + 30)  # headroom, floor, one and a half blocks
    done, _ = await h.ask([*SYSTEM, 11, 12])
    assert h.store.stats.saves_failed == 1
    assert h.block_store.saves  # a file was written, then dropped
    assert h.block_store.files == {}
    again, _ = await h.ask([*SYSTEM, 11, 12, *done.token_ids, 13])
    assert again.stats.cached_tokens >= len(SYSTEM)


async def test_the_reserve_is_kept_before_a_block_is_written_by_cutting_older_agents() -> None:
    """Without that, the second agent's last blocks would find the disk full."""
    reserve = 20  # beside it, room for five blocks, and the headroom
    h = await on_a_disk(10 + 100 + reserve, floor=0, reserve=reserve)
    await h.ask([1, *SYSTEM[1:], 50], agent="a0")  # with its reply, 16 tokens: 4 blocks
    assert (h.block_store.free_bytes() or 0) >= reserve
    await h.ask([2, *SYSTEM[1:], 51], agent="a1")
    assert not h.metadata.agent_rows[("default", "a0")].block_keys
    assert len(h.metadata.agent_rows[("default", "a1")].block_keys) == 4
    assert (h.block_store.free_bytes() or 0) >= reserve
    assert h.block_store.files.keys() == h.metadata.block_rows.keys()
    assert h.store.stats.saves_failed == 0
