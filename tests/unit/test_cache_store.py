from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest

from semantic.application.cache.lineage import ANONYMOUS_AGENT, ANONYMOUS_PREFIX, branch_prefix
from semantic.application.cache.read_lanes import READERS
from semantic.application.cache.store import AgentCacheStore, CacheConfig, CachedPrefix, LeaseOf
from semantic.application.engine.batch_engine import BlockPoolBatchEngine, EngineConfig
from semantic.application.engine.events import CompletionEvent
from semantic.application.scheduler.pacer import PacerConfig
from semantic.domain.block_pool import BlockPool
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.quotas import NamespaceQuotas
from semantic.ports.block_store import LayerPayload
from tests.unit.fakes import FakeBackend, FakeTokenizer, next_token
from tests.unit.storage_fakes import FakeBlockStore, FakeMetadataStore

SYSTEM = [7, 3, 9, 1, 4, 4, 2, 8, 6, 5]  # 10 tokens: 2 full blocks of 4 and a partial
MAX_STEPS = 2000  # far more than any request here needs: beyond it, the engine is stuck


class Harness:
    """The cache store wired to a fake model, the way the server wires it."""

    def __init__(
        self,
        capacity: int = 400,
        *,
        block_store: FakeBlockStore | None = None,
        metadata: FakeMetadataStore | None = None,
        fingerprint: str = "model-a",
        quota: int | None = None,
        reserve: int = 0,
        backend: FakeBackend | None = None,
        floor: int = 0,
        lease_of: LeaseOf | None = None,
        quotas: NamespaceQuotas | None = None,
        sweep_s: float = 0.5,
        eviction: str = "agent",
    ) -> None:
        self.backend = backend or FakeBackend()
        self.pool = BlockPool(capacity)
        self.block_store = block_store or FakeBlockStore()
        self.metadata = metadata or FakeMetadataStore()
        self.store = AgentCacheStore(
            self.pool,
            self.backend.spec,
            fingerprint,
            block_store=self.block_store,
            agent_records=self.metadata,
            block_records=self.metadata,
            config=CacheConfig(
                disk_quota_bytes=quota,
                disk_reserve_bytes=reserve,
                disk_floor_bytes=floor,
                quotas=quotas or NamespaceQuotas(),
                expire_every_s=sweep_s,
                eviction=eviction,
            ),
            lease_of=lease_of,
        )
        config = EngineConfig(prefill_chunk_tokens=4, pacer=PacerConfig(fixed_tokens=64))
        self.engine = BlockPoolBatchEngine(
            self.backend, FakeTokenizer(), self.pool, config, reclaim=self.store.reclaim
        )

    async def ask(
        self, prompt: Sequence[int], agent: str = "a", namespace: str = "default", n: int = 5
    ) -> tuple[CompletionEvent, CachedPrefix]:
        prefix = await self.store.prepare(namespace, prompt)
        request_id = self.engine.submit(
            agent, prompt, prefix.blocks, max_tokens=n, namespace=namespace, stored=prefix.stored
        )
        self.store.release(prefix)
        done = None
        for _ in range(MAX_STEPS):
            if not self.engine.has_work():
                break
            for event in self.engine.step().events:
                if isinstance(event, CompletionEvent):
                    self.store.adopt(event, agent)
                    if event.request_id == request_id:
                        done = event
        await self.store.flush()
        assert done is not None
        return done, prefix


def cold(prompt: Sequence[int], n: int) -> tuple[int, ...]:
    history, out = list(prompt), []
    for _ in range(n):
        out.append(next_token(history))
        history.append(out[-1])
    return tuple(out)


async def started(harness: Harness) -> Harness:
    await harness.metadata.open()  # as the composition root does before the store starts
    await harness.store.start()
    return harness


async def test_a_returning_agent_restores_its_prefix_and_answers_as_cold() -> None:
    h = await started(Harness())
    first, _ = await h.ask([*SYSTEM, 11, 12])
    follow = [*SYSTEM, 11, 12, *first.token_ids, 13, 14]
    done, prefix = await h.ask(follow)
    assert done.stats.cached_tokens == len(SYSTEM) + 2 + len(first.token_ids)
    assert prefix.hot_tokens >= done.stats.cached_tokens
    assert done.token_ids == cold(follow, 5)


async def test_each_turn_writes_only_new_blocks_and_the_partial_tail() -> None:
    h = await started(Harness())
    first, _ = await h.ask([*SYSTEM, 11, 12])
    written_first = list(h.block_store.saves)
    follow = [*SYSTEM, 11, 12, *first.token_ids, 13, 14]
    await h.ask(follow)
    written_second = h.block_store.saves[len(written_first) :]
    assert not set(written_second) & set(written_first[:-1]), "a full block was written twice"
    assert len(written_second) <= (len(follow) + 5 - len(SYSTEM) - 2 - 5) // 4 + 2


async def test_agents_sharing_a_prompt_store_its_blocks_once() -> None:
    h = await started(Harness())
    await h.ask([*SYSTEM, 20, 21], agent="one")
    saves = len(h.block_store.saves)
    done, prefix = await h.ask([*SYSTEM, 30, 31], agent="two")
    assert prefix.matched_tokens == len(SYSTEM)
    assert done.stats.cached_tokens == len(SYSTEM)
    shared = [k for k, r in h.metadata.block_rows.items() if r.ref_count == 2]
    assert len(shared) == len(SYSTEM) // 4
    assert len(h.block_store.saves) - saves < len(SYSTEM) // 4 + 3


async def test_a_prefix_ending_inside_a_block_is_reused_token_by_token() -> None:
    h = await started(Harness())
    await h.ask([*SYSTEM, 40, 41, 42, 43])
    done, _ = await h.ask([*SYSTEM, 50])
    assert done.stats.cached_tokens == len(SYSTEM)


async def test_after_a_restart_the_prefix_comes_back_from_disk() -> None:
    before = await started(Harness())
    first, _ = await before.ask([*SYSTEM, 11, 12])
    await before.store.close()
    after = await started(Harness(block_store=before.block_store, metadata=before.metadata))
    follow = [*SYSTEM, 11, 12, *first.token_ids, 13]
    done, prefix = await after.ask(follow)
    assert prefix.disk_tokens > 0
    assert prefix.hot_tokens == 0
    assert done.stats.cached_tokens == len(follow) - 1
    assert done.token_ids == cold(follow, 5)


async def test_a_restore_whose_caller_goes_away_leaves_no_block_pinned() -> None:
    before = await started(Harness())
    await before.ask([*SYSTEM, 11, 12])
    after = await started(Harness(block_store=before.block_store, metadata=before.metadata))
    reading, go_on = threading.Event(), threading.Event()
    load = after.block_store.load

    def slow_load(key: str, checksum: str) -> list[LayerPayload]:
        reading.set()
        go_on.wait()
        return load(key, checksum)

    after.block_store.load = slow_load  # type: ignore[method-assign]  # a read that hangs
    restore = asyncio.create_task(after.store.prepare("default", [*SYSTEM, 11, 12, 13]))
    await asyncio.to_thread(reading.wait)
    restore.cancel()
    with pytest.raises(asyncio.CancelledError):
        await restore
    go_on.set()
    await after.store.close()  # waits for the reads still running
    for _ in range(500):  # then the restore's own end, handed back to this loop
        if not pinned(after):
            break
        await asyncio.sleep(0.01)
    assert not pinned(after)


def pinned(harness: Harness) -> list[str]:
    return [owner for owner in harness.pool.owners() if owner.startswith("pin-")]


async def test_a_corrupt_block_is_quarantined_and_the_request_recomputes() -> None:
    before = await started(Harness())
    first, _ = await before.ask([*SYSTEM, 11, 12])
    after = await started(Harness(block_store=before.block_store, metadata=before.metadata))
    second_block = next(iter(before.metadata.agent_rows.values())).block_keys[1]
    after.block_store.corrupted.add(second_block)
    follow = [*SYSTEM, 11, 12, *first.token_ids, 13]
    done, prefix = await after.ask(follow)
    assert after.block_store.quarantined == [second_block]
    assert after.store.stats.corrupt_blocks == 1
    assert prefix.matched_tokens == 4, "only the block before the bad one is used"
    assert done.token_ids == cold(follow, 5)


async def test_a_corrupt_block_whose_quarantine_fails_still_leaves_a_right_answer() -> None:
    """A read-only data directory: marking the block fails, the request recomputes."""
    before = await started(Harness())
    first, _ = await before.ask([*SYSTEM, 11, 12])
    after = await started(Harness(block_store=before.block_store, metadata=before.metadata))
    after.block_store.corrupted.add(next(iter(before.metadata.agent_rows.values())).block_keys[1])

    async def read_only(key: str) -> None:
        raise OSError(30, "Read-only file system")

    after.metadata.quarantine_block = read_only  # type: ignore[method-assign]  # a failing disk
    follow = [*SYSTEM, 11, 12, *first.token_ids, 13]
    done, prefix = await after.ask(follow)
    assert prefix.matched_tokens == 4, "only the block before the bad one is used"
    assert done.token_ids == cold(follow, 5)
    assert not pinned(after)


async def test_a_restore_of_more_blocks_than_readers_comes_back_in_order() -> None:
    """Past ``READERS`` blocks, each read task takes a run of blocks: the prefix must still
    come back whole and in order, and stop cleanly before a bad block in any run."""
    long_prompt = [*SYSTEM, *(10 + i % 50 for i in range(4 * (READERS + 3)))]
    before = await started(Harness())
    first, _ = await before.ask(long_prompt)
    follow = [*long_prompt, *first.token_ids, 13]
    after = await started(Harness(block_store=before.block_store, metadata=before.metadata))
    done, prefix = await after.ask(follow)
    assert prefix.blocks is not None
    assert prefix.hot_tokens == 0
    assert prefix.blocks.token_ids == tuple(follow[: prefix.matched_tokens])
    assert prefix.matched_tokens == len(follow) - 1
    assert done.token_ids == cold(follow, 5)

    again = await started(Harness(block_store=before.block_store, metadata=before.metadata))
    sixth = next(iter(before.metadata.agent_rows.values())).block_keys[5]
    again.block_store.corrupted.add(sixth)
    done, prefix = await again.ask(follow)
    assert prefix.matched_tokens == 5 * 4, "only the blocks before the bad one are used"
    assert not pinned(again)
    assert done.token_ids == cold(follow, 5)


async def test_a_read_that_raises_fails_the_restore_and_leaves_nothing_pinned() -> None:
    h, keys = await restarted_after_a_long_prompt()
    load = h.block_store.load

    def failing_load(key: str, checksum: str) -> list[LayerPayload]:
        if key == keys[2]:
            raise OSError("the disk went away")
        return load(key, checksum)

    h.block_store.load = failing_load  # type: ignore[method-assign]  # a read that raises
    with pytest.raises(OSError, match="went away"):
        await h.store.prepare("default", LONG_PROMPT)
    await asyncio.sleep(0)  # the unpinning is handed back to this loop
    assert not pinned(h)


async def test_a_read_task_stops_at_its_first_bad_block() -> None:
    """Blocks after a bad one are dropped: loading them would evict others for nothing."""
    h, keys = await restarted_after_a_long_prompt()
    load, asked = h.block_store.load, []

    def watched_load(key: str, checksum: str) -> list[LayerPayload]:
        asked.append(key)
        return load(key, checksum)

    h.block_store.load = watched_load  # type: ignore[method-assign]  # a spy on the fake
    h.block_store.corrupted.add(keys[2])
    prefix = await h.store.prepare("default", LONG_PROMPT)
    assert prefix.matched_tokens == 2 * 4
    assert keys[4] not in asked, "the task that met block 2 read on"
    assert keys[3] in asked, "the other task reads its own blocks"
    h.store.release(prefix)
    assert not pinned(h)


async def test_a_stored_prefix_is_pinned_again_from_disk_once_evicted() -> None:
    """What a waiting request does at admission when its pin was let go meanwhile."""
    h, _ = await restarted_after_a_long_prompt()
    prefix = await h.store.prepare("default", LONG_PROMPT)
    assert prefix.stored is not None
    assert prefix.stored.tokens == prefix.matched_tokens == len(LONG_PROMPT)
    h.store.release(prefix)
    h.store.reclaim(h.pool.capacity)
    assert h.pool.used_count == 0, "every restored block was evicted"
    first_reads = list(h.block_store.loads)
    again = await asyncio.to_thread(prefix.stored.pin, "again")
    assert again is not None
    assert again.token_ids[: len(LONG_PROMPT)] == tuple(LONG_PROMPT)
    read_again = h.block_store.loads[len(first_reads) :]
    assert sorted(read_again) == sorted(first_reads), "each block read again, once"
    assert set(again.pool_ids()) == h.pool.held_by("again")
    h.pool.release_owner("again")
    assert not pinned(h)


async def test_a_prefix_pinned_again_is_counted_once_in_the_metrics() -> None:
    """QA pass 13: with a small pool, restores that found no room at arrival and were read
    at admission were missing from the metrics (805 of 6,825 tokens)."""
    h, _ = await restarted_after_a_long_prompt()
    filler = h.pool.allocate("filler", 0, h.pool.free_count)  # no room for any block now
    prefix = await h.store.prepare("default", LONG_PROMPT)
    assert prefix.stored is not None
    assert prefix.matched_tokens == 0
    assert (h.store.stats.hit_tokens, h.store.stats.disk_restored_tokens) == (0, 0)
    h.pool.release("filler", filler)
    again = await asyncio.to_thread(prefix.stored.pin, "again")
    assert again is not None
    stats = h.store.stats
    whole = (len(LONG_PROMPT) - 1, len(LONG_PROMPT), 0)  # the prompt's last token is fed
    assert (stats.hit_tokens, stats.disk_restored_tokens, stats.hot_restored_tokens) == whole
    h.pool.release_owner("again")
    second = await asyncio.to_thread(prefix.stored.pin, "twice")  # hot now: nothing more
    assert second is not None
    assert (stats.hit_tokens, stats.disk_restored_tokens, stats.hot_restored_tokens) == whole
    h.pool.release_owner("twice")
    h.store.release(prefix)
    assert not pinned(h)


async def test_a_hot_prefix_evicted_while_its_request_waits_comes_back_from_disk() -> None:
    h = await started(Harness())
    first, _ = await h.ask([*SYSTEM, 11, 12])
    follow = [*SYSTEM, 11, 12, *first.token_ids, 13]
    prefix = await h.store.prepare("default", follow)
    assert prefix.stored is not None
    assert prefix.hot_tokens == prefix.stored.tokens > 0
    h.store.release(prefix)
    h.store.reclaim(h.pool.capacity)
    assert h.pool.used_count == 0, "every block was evicted"
    again = await asyncio.to_thread(prefix.stored.pin, "again")
    assert again is not None
    assert again.token_ids[: prefix.stored.tokens] == tuple(follow[: prefix.stored.tokens])
    h.pool.release_owner("again")


async def test_a_stored_prefix_ends_before_a_block_found_corrupt() -> None:
    h, keys = await restarted_after_a_long_prompt()
    h.block_store.corrupted.add(keys[2])
    prefix = await h.store.prepare("default", LONG_PROMPT)
    assert prefix.stored is not None
    assert prefix.stored.tokens == prefix.matched_tokens == 2 * 4
    h.store.release(prefix)


LONG_PROMPT = [*SYSTEM, *(10 + i % 50 for i in range(4 * (READERS + 3)))]


async def restarted_after_a_long_prompt() -> tuple[Harness, tuple[str, ...]]:
    """A store restarted over the blocks of a prompt longer than ``READERS`` blocks."""
    before = await started(Harness())
    await before.ask(LONG_PROMPT)
    keys = next(iter(before.metadata.agent_rows.values())).block_keys
    return await started(Harness(block_store=before.block_store, metadata=before.metadata)), keys


async def test_namespaces_never_share_blocks() -> None:
    h = await started(Harness())
    await h.ask([*SYSTEM, 11, 12], namespace="tenant-a")
    done, prefix = await h.ask([*SYSTEM, 11, 12], namespace="tenant-b")
    assert prefix.matched_tokens == 0
    assert done.stats.cached_tokens == 0


async def test_another_model_never_reuses_old_blocks() -> None:
    before = await started(Harness(fingerprint="model-a"))
    await before.ask([*SYSTEM, 11, 12])
    after = await started(
        Harness(block_store=before.block_store, metadata=before.metadata, fingerprint="model-b")
    )
    done, prefix = await after.ask([*SYSTEM, 11, 12])
    assert prefix.matched_tokens == 0
    assert done.stats.cached_tokens == 0


async def test_memory_pressure_evicts_idle_saved_blocks_before_refusing() -> None:
    h = await started(Harness(capacity=40))
    for agent in range(8):
        done, _ = await h.ask([agent + 1, *SYSTEM[1:], 40 + agent], agent=f"a{agent}")
        assert done.finish_reason.value != "pool_exhausted"
    assert len(h.store.hot) < 8 * 4
    h.pool.check_integrity()


async def test_blocks_whose_save_failed_give_their_memory_back_under_pressure() -> None:
    """A full disk: no save will ever make these blocks safe on disk, so waiting for that
    would hold the pool, and every later request, forever (QA pass 6)."""
    h = await started(Harness(capacity=40))
    h.block_store.full = True
    for agent in range(8):
        done, _ = await h.ask([agent + 1, *SYSTEM[1:], 40 + agent], agent=f"a{agent}")
        assert (done.finish_reason.value, done.error) == ("max_tokens", None)
    assert h.store.stats.saves_failed == 8
    h.pool.check_integrity()


async def test_a_disk_quota_drops_the_least_recently_used_agents_unshared_blocks() -> None:
    h = await started(Harness(quota=300))
    for agent in range(6):
        await h.ask([agent + 1, *SYSTEM[1:], 50 + agent], agent=f"a{agent}")
    assert await h.metadata.total_block_bytes() <= 300
    newest = h.metadata.agent_rows[("default", "a5")]
    oldest = h.metadata.agent_rows[("default", "a0")]
    assert newest.block_keys
    assert len(oldest.block_keys) < len(newest.block_keys)
    assert set(h.block_store.files) == set(h.metadata.block_rows)


async def test_a_disk_quota_frees_blocks_only_older_records_share() -> None:
    """Review: an agent and its old branch shared their first blocks, so neither was the
    last to hold them, and the quota cut the agent saved last instead."""

    async def talk(h: Harness) -> tuple[str, ...]:
        await h.ask([*SYSTEM, 11, 12, 13, 14, 15, 16, 17, 18])
        await h.ask([*SYSTEM, 20, 21, 22, 23, 24, 25, 26, 27])  # a's branch shares SYSTEM
        await h.ask([40, 41, 42, 43, 44, 45], agent="b")
        return h.metadata.agent_rows[("default", "b")].block_keys

    unlimited = await talk(await started(Harness()))
    h = await started(Harness(quota=80))  # b's blocks fit; not with the two records' SYSTEM
    assert await talk(h) == unlimited
    assert await h.metadata.total_block_bytes() <= 80
    kept = {r.agent_id: r.block_keys for r in await h.metadata.agents()}
    assert kept == {"a": (), "b": unlimited}, "the branch, with nothing left, is gone"
    assert set(h.block_store.files) == set(h.metadata.block_rows)


async def test_recovery_removes_files_no_row_knows() -> None:
    h = await started(Harness())
    await h.ask([*SYSTEM, 11])
    h.block_store.files["stray-key"] = ([], "x")
    await h.store.close()
    again = await started(Harness(block_store=h.block_store, metadata=h.metadata))
    assert "stray-key" not in again.block_store.files


async def test_block_files_beside_a_database_that_knows_none_are_set_aside_not_deleted() -> None:
    h = await started(Harness())
    await h.ask([*SYSTEM, 11])
    await h.store.close()
    kept = set(h.block_store.files)
    fresh = await started(Harness(block_store=h.block_store))  # a new, empty database
    assert not fresh.block_store.files
    assert set(fresh.block_store.quarantined) == kept


async def test_a_disk_quota_below_one_conversation_cuts_its_end_and_keeps_its_prefix() -> None:
    """The agent saved last is cut too when nothing else is left to drop: a cap, not a
    target (QA pass 6: 45 MiB on disk under a 5 MiB quota)."""
    h = await started(Harness(quota=50))
    first, _ = await h.ask([*SYSTEM, 11, 12])
    assert 0 < await h.metadata.total_block_bytes() <= 50
    kept = h.metadata.agent_rows[("default", "a")].block_keys
    assert 0 < len(kept) < 5, "a prefix of its five blocks"
    assert set(h.block_store.files) == set(h.metadata.block_rows)
    follow = [*SYSTEM, 11, 12, *first.token_ids, 13]
    done, _ = await h.ask(follow)
    assert done.token_ids == cold(follow, 5)
    assert await h.metadata.total_block_bytes() <= 50


async def test_anonymous_conversations_sharing_a_long_prefix_keep_their_own_records() -> None:
    """QA pass 9: conversations without an agent that shared their first two blocks were one
    record, so each save dropped the others' blocks and a restart lost all but one."""
    before = await started(Harness())
    talks = [[*SYSTEM, 50 + n, 51 + n, 52, 53, 54] for n in range(3)]
    for prompt in talks:
        await before.ask(prompt, agent=ANONYMOUS_AGENT)
    assert len(await before.metadata.agents()) == 3
    await before.store.close()
    after = await started(Harness(block_store=before.block_store, metadata=before.metadata))
    for prompt in talks:
        done, prefix = await after.ask(prompt, agent=ANONYMOUS_AGENT)
        assert prefix.disk_tokens > 0
        assert done.stats.cached_tokens == len(prompt) - 1


async def test_an_anonymous_conversations_next_turn_replaces_its_record() -> None:
    h = await started(Harness())
    first, _ = await h.ask([*SYSTEM, 11, 12], agent=ANONYMOUS_AGENT)
    await h.ask([*SYSTEM, 20], agent=ANONYMOUS_AGENT)  # another conversation, same system
    follow = [*SYSTEM, 11, 12, *first.token_ids, 13, 14]
    done, _ = await h.ask(follow, agent=ANONYMOUS_AGENT)
    records = await h.metadata.agents()
    assert len(records) == 2
    assert max(r.token_count for r in records) == len(follow) + len(done.token_ids)
    assert all(r.agent_id.startswith(ANONYMOUS_PREFIX) and r.anonymous for r in records)


async def test_a_new_conversation_equal_to_anothers_first_turn_leaves_it_whole() -> None:
    """Review: a record was named after its chain when first saved and kept that name as it
    grew, so a later conversation equal to its first turn took the name, and its blocks."""
    h = await started(Harness())
    first, _ = await h.ask([*SYSTEM, 11, 12], agent=ANONYMOUS_AGENT)
    follow = [*SYSTEM, 11, 12, *first.token_ids, 13, 14]
    done, _ = await h.ask(follow, agent=ANONYMOUS_AGENT)
    await h.ask([*SYSTEM, 11, 12], agent=ANONYMOUS_AGENT)  # the first turn, by someone else
    counts = sorted(r.token_count for r in await h.metadata.agents())
    assert counts == [len(follow) - 2, len(follow) + len(done.token_ids)]
    assert set(h.block_store.files) == set(h.metadata.block_rows)


async def test_an_agent_that_branches_keeps_its_old_branch_across_a_restart() -> None:
    """QA pass 9: an agent that went A, B, then back to A found only B's blocks stored."""
    before = await started(Harness())
    first_a, _ = await before.ask([*SYSTEM, 11, 12])
    first_b, _ = await before.ask([*SYSTEM, 20, 21])
    await before.store.close()
    after = await started(Harness(block_store=before.block_store, metadata=before.metadata))
    for prompt, reply in (([*SYSTEM, 11, 12], first_a), ([*SYSTEM, 20, 21], first_b)):
        follow = [*prompt, *reply.token_ids, 13]
        done, _ = await after.ask(follow)
        assert done.stats.cached_tokens == len(follow) - 1
        assert done.token_ids == cold(follow, 5)


async def test_a_branch_the_agent_grows_to_cover_again_is_dropped() -> None:
    h = await started(Harness())
    first_a, _ = await h.ask([*SYSTEM, 11, 12])
    await h.ask([*SYSTEM, 20, 21])
    await h.ask([*SYSTEM, 11, 12, *first_a.token_ids, 13])
    records = sorted(await h.metadata.agents(), key=lambda a: a.agent_id)
    assert records[0].agent_id == "a"
    assert len(records) == 2, "A's branch is covered by the agent again; B's is kept"
    assert records[1].agent_id.startswith(branch_prefix("a"))
    assert h.metadata.block_rows[records[1].block_keys[2]].tokens == (6, 5, 20, 21)
    assert set(h.block_store.files) == set(h.metadata.block_rows)


async def test_a_disk_short_of_its_reserve_drops_the_least_recently_used_agents_blocks() -> None:
    """No quota set, but the disk is filling (by something else): cached KV gives way, so
    the transcripts and the database can still be written."""
    h = await started(Harness(reserve=1000))
    h.block_store.free = 5000
    for agent in range(3):
        await h.ask([agent + 1, *SYSTEM[1:], 50 + agent], agent=f"a{agent}")
    full = await h.metadata.total_block_bytes()
    h.block_store.free = 1000 - 200  # 200 bytes short of the reserve
    await h.ask([9, *SYSTEM[1:], 59], agent="a3")
    newest = h.metadata.agent_rows[("default", "a3")]
    added = sum(h.metadata.block_rows[k].nbytes for k in newest.block_keys)
    assert await h.metadata.total_block_bytes() <= full + added - 200
    oldest = h.metadata.agent_rows[("default", "a0")]
    assert len(oldest.block_keys) < len(newest.block_keys)
    assert set(h.block_store.files) == set(h.metadata.block_rows)


async def test_a_full_disk_frees_room_even_though_the_save_that_found_it_failed() -> None:
    """Review: a save that failed for want of space never reached the quota pass, so a disk
    another program filled stayed full and every later save failed too."""
    h = await started(Harness(reserve=1000))
    h.block_store.free = 5000
    for agent in range(3):
        await h.ask([agent + 1, *SYSTEM[1:], 50 + agent], agent=f"a{agent}")
    stored = await h.metadata.total_block_bytes()
    h.block_store.full, h.block_store.free = True, 0
    await h.ask([9, *SYSTEM[1:], 59], agent="a3")
    assert h.store.stats.saves_failed == 1
    assert await h.metadata.total_block_bytes() < stored
    assert not h.metadata.agent_rows[("default", "a0")].block_keys
    assert set(h.block_store.files) == set(h.metadata.block_rows)


async def test_a_deleted_agents_superseded_blocks_are_not_found_again() -> None:
    """QA pass 10: partial blocks a later turn had replaced stayed in memory, and were found
    again after the agent was deleted once its system prompt had been computed again."""
    h = await started(Harness())
    system = SYSTEM[:8]  # two whole blocks: the first turn ends in a partial third one
    first, _ = await h.ask([*system, 11], n=2)
    history = [*system, 11, *first.token_ids, 13]
    await h.ask(history, n=2)
    await h.store.forget(await h.metadata.delete_agent("default", "a"))
    await h.ask([*system, 30], agent=ANONYMOUS_AGENT, n=2)  # the system prompt again
    done, _ = await h.ask(history, agent=ANONYMOUS_AGENT, n=2)
    assert done.stats.cached_tokens == len(system)


async def test_a_disk_short_of_its_reserve_still_keeps_the_agent_just_saved() -> None:
    """QA pass 10: with another program's files below the reserve, every save was cut at
    once, and no agent had anything cached, not even in memory."""
    h = await started(Harness(reserve=1000))
    h.block_store.free = 10  # far below the reserve, whatever is dropped
    await h.ask([*SYSTEM, 11, 12], agent="a0")
    await h.ask([*SYSTEM, 20], agent="a1")
    follow = [*SYSTEM, 20, 21]
    done, _ = await h.ask(follow, agent="a1")
    assert done.stats.cached_tokens >= len(SYSTEM) + 1
    assert not h.metadata.agent_rows[("default", "a0")].block_keys[len(SYSTEM) // 4 + 1 :]


SLIDING = ModelCacheSpec(
    n_layers=2,
    n_kv_heads=1,
    k_head_dim=2,
    v_head_dim=2,
    kv_dtype="float32",
    layer_windows=(6, None),
    block_tokens=4,
)


async def test_a_turn_after_a_fork_restores_from_its_own_last_turn_not_the_forks() -> None:
    """Issue 36: the fork's block matches one token more, but its sliding layer kept only
    its own last window; the agent's own partial tail holds the window this prompt needs.
    (The fake's sliding layer keeps its last window only, as a rotating cache does.)"""
    h = await started(Harness(backend=FakeBackend(spec=SLIDING)))
    first, _ = await h.ask([*SYSTEM, 11, 12], agent="a")
    stored = [*SYSTEM, 11, 12, *first.token_ids]
    forked, _ = await h.ask([*stored, 50, 41], agent="fork")
    assert forked.stats.cached_tokens == len(stored)
    follow = [*stored, 50, 51]
    done, prefix = await h.ask(follow, agent="a")
    assert done.error is None
    assert done.token_ids == cold(follow, 5)
    assert (done.stats.cached_tokens, done.stats.dropped_tokens) == (len(stored), 0)
    assert prefix.matched_tokens == len(stored)
    assert h.store.stats.hit_tokens == 2 * len(stored)
    assert h.pool.held_by(prefix.pin) == set(), "the tail not taken was let go"
