"""Retention hints: how clients say them, how memory orders its evictions by them, how a
TTL moves blocks to disk, and how a pin keeps them there (ADR 0028)."""

from __future__ import annotations

import math

import pytest

from semantic.application.cache.eviction_policy import (
    AgentRecordOrder,
    agent_order,
    lru_order,
    lru_records,
)
from semantic.application.cache.hot_index import CACHE_OWNER, HotBlock, HotIndex
from semantic.application.cache.retention_book import BlockHint, RetentionBook
from semantic.application.cache.tool_waits import CAP_S, FIRST_GUESS_S, ToolWaits
from semantic.domain.block_pool import BlockPool
from semantic.domain.blocks import KVBlock
from semantic.domain.errors import InvalidRequestError
from semantic.domain.retention import (
    Retention,
    anthropic_change,
    header_change,
    longest,
    openai_change,
)
from semantic.ports.metadata_store import AgentRecord
from tests.unit.test_cache_store import SYSTEM, Harness, started


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_header_and_the_sdks_fields_say_the_same_hints() -> None:
    assert header_change("priority=80, ttl=300, pinned") == {
        "priority": 80,
        "ttl_seconds": 300.0,
        "pinned": True,
    }
    assert header_change("ttl=none, pinned=false") == {"ttl_seconds": None, "pinned": False}
    assert openai_change("in_memory") == {"ttl_seconds": 600.0}
    assert openai_change("24h") == {"ttl_seconds": 86_400.0}
    assert anthropic_change({"type": "ephemeral"}, "system") == {"ttl_seconds": 300.0}
    assert anthropic_change({"type": "ephemeral", "ttl": "1h"}, "tools") == {"ttl_seconds": 3600.0}
    marks = [{"ttl_seconds": 300.0}, {}, {"ttl_seconds": 3600.0}]
    assert longest(marks) == {"ttl_seconds": 3600.0}
    changed = Retention(priority=10).changed({"ttl_seconds": 5.0})
    assert changed == Retention(10, 5.0, False)  # the fields not given stay


@pytest.mark.parametrize(
    ("say", "param"),
    [
        (lambda: Retention().changed({"priority": 101}), "priority"),
        (lambda: Retention().changed({"priority": -1}), "priority"),
        (lambda: Retention().changed({"priority": True}), "priority"),
        (lambda: Retention().changed({"ttl_seconds": -5}), "ttl_seconds"),
        (lambda: Retention().changed({"ttl_seconds": 0}), "ttl_seconds"),
        (lambda: Retention().changed({"ttl_seconds": 1e9}), "ttl_seconds"),
        (lambda: Retention().changed({"ttl_seconds": math.nan}), "ttl_seconds"),
        (lambda: Retention().changed({"pinned": "yes"}), "pinned"),
        (lambda: Retention().changed({"forever": True}), "forever"),
        (lambda: header_change("ttl=soon"), "X-Retention"),
        (lambda: header_change("colour=blue"), "X-Retention"),
        (lambda: header_change("priority=500"), "X-Retention"),
        (lambda: header_change("priority=10, priority=20"), "X-Retention"),
        (lambda: header_change("ttl=5, ttl_seconds=9"), "X-Retention"),
        (lambda: openai_change("forever"), "prompt_cache_retention"),
        (lambda: anthropic_change({"type": "ephemeral", "ttl": "2h"}, "system"), "system"),
        (lambda: anthropic_change({"type": "persistent"}, "messages"), "messages"),
    ],
)
def test_bad_hints_are_refused_naming_the_field(say: object, param: str) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        say()  # type: ignore[operator]  # each case is a callable
    assert refused.value.param == param


def hot_index(clock: Clock, order: object = agent_order) -> tuple[HotIndex, BlockPool]:
    pool = BlockPool(16)
    return HotIndex(pool, clock, order), pool  # type: ignore[arg-type]  # an EvictionOrder


def add(index: HotIndex, pool: BlockPool, key: str, clock: Clock) -> HotBlock:
    clock.now += 1  # each later than the one before
    layer = KVBlock(pool.allocate(CACHE_OWNER, 0)[0], 0, 0, 4, None)
    block = index.add(HotBlock(key, "", 0, (1, 2, 3, 4), (layer,)))
    index.mark_persisted([key])
    return block


def test_memory_gives_up_expired_unpinned_low_priority_blocks_first() -> None:
    clock = Clock()
    index, pool = hot_index(clock)
    blocks = {key: add(index, pool, key, clock) for key in ("pin", "ttl", "high", "low", "old")}
    index.retain([blocks["pin"]], BlockHint(pinned=True))
    index.retain([blocks["ttl"]], BlockHint(expires_at=clock.now + 60))
    index.retain([blocks["high"]], BlockHint(priority=90))
    index.retain([blocks["low"]], BlockHint(priority=10))
    index.retain([blocks["old"]], BlockHint(expires_at=clock.now - 1))  # its TTL is past
    gone = []
    for _ in range(5):
        left = {key for key in blocks if key in index}
        index.evict(1)
        gone += [key for key in left if key not in index]
    assert gone == ["old", "low", "high", "ttl", "pin"]


def test_lru_ignores_the_hints() -> None:
    clock = Clock()
    index, pool = hot_index(clock, lru_order)
    first = add(index, pool, "first", clock)
    add(index, pool, "second", clock)
    index.retain([first], BlockHint(priority=100, pinned=True))
    index.evict(1)
    assert "first" not in index
    assert "second" in index


def test_a_block_takes_the_longest_keep_of_its_users() -> None:
    clock = Clock()
    index, pool = hot_index(clock)
    shared = add(index, pool, "shared", clock)
    index.retain([shared], BlockHint(expires_at=clock.now + 5))
    index.retain([shared], BlockHint(expires_at=clock.now + 1, priority=70))
    assert (shared.expires_at, shared.priority) == (clock.now + 5, 70)
    index.retain([shared], BlockHint())  # an agent keeping it without a TTL
    assert shared.expires_at == math.inf
    clock.now += 3600
    assert index.expire() == 0


def test_a_ttl_moves_saved_unused_blocks_to_disk_when_it_ends() -> None:
    clock = Clock()
    index, pool = hot_index(clock)
    saved = add(index, pool, "saved", clock)
    in_use = add(index, pool, "in-use", clock)
    unsaved = index.add(
        HotBlock(
            "unsaved", "", 0, (1,), (KVBlock(pool.allocate(CACHE_OWNER, 0)[0], 0, 0, 1, None),)
        )
    )
    hint = BlockHint(expires_at=clock.now + 2)
    index.retain([saved, in_use, unsaved], hint)
    pool.share("a-request", in_use.pool_ids())
    assert index.expire() == 0  # not yet
    clock.now += 3
    assert index.expire() == 1
    assert "saved" not in index
    assert {"in-use", "unsaved"} <= {key for key in ("in-use", "unsaved") if key in index}


def test_the_book_gives_an_agents_hints_to_its_next_use() -> None:
    clock = Clock()
    book = RetentionBook(clock)
    assert book.hint("ns", "a") == BlockHint()
    book.set("ns", "a", Retention(80, 30.0, True))
    assert book.hint("ns", "a") == BlockHint(80, clock.now + 30, True)
    book.forget("ns", "a")
    assert book.hint("ns", "a") == BlockHint()


async def test_a_pinned_agent_keeps_its_blocks_on_disk_through_other_traffic() -> None:
    h = await started(Harness(quota=300))
    await h.ask([1, *SYSTEM[1:], 50], agent="pinned")
    await h.metadata.set_retention("default", "pinned", Retention(pinned=True).to_json())
    kept = h.metadata.agent_rows[("default", "pinned")].block_keys
    for agent in range(8):
        await h.ask([agent + 2, *SYSTEM[1:], 40 + agent], agent=f"other{agent}")
    assert h.metadata.agent_rows[("default", "pinned")].block_keys == kept
    assert set(kept) <= set(h.block_store.files)
    assert await h.metadata.total_block_bytes() <= 300 + sum(
        h.metadata.block_rows[key].nbytes for key in kept
    )
    oldest_other = h.metadata.agent_rows[("default", "other0")]
    assert len(oldest_other.block_keys) < len(kept)  # the others gave way instead


def test_an_agent_waiting_on_its_tools_keeps_its_kv_for_as_long_as_they_take() -> None:
    clock = Clock()
    waits = ToolWaits(clock)
    assert waits.started("ns", "a", ["search"]) == clock.now + 2 * FIRST_GUESS_S
    clock.now += 3
    waits.returned("ns", "a")
    assert waits.expected("ns", "a", "search") == 3
    assert waits.started("ns", "a", ["search", "unseen"]) == clock.now + 2 * FIRST_GUESS_S
    clock.now += 1e6  # a gap past the cap counts as the cap
    waits.returned("ns", "a")
    assert waits.expected("ns", "a", "search") == pytest.approx(3 + 0.3 * (CAP_S - 3))
    for _ in range(30):
        waits.started("ns", "a", ["search"])
        clock.now += 1e6
        waits.returned("ns", "a")
    assert waits.started("ns", "a", ["search"]) == clock.now + CAP_S  # the hold is capped
    assert waits.expected("ns", "b", "search") is None  # each agent its own


def test_blocks_held_for_a_tool_wait_leave_memory_after_the_others() -> None:
    clock = Clock()
    index, pool = hot_index(clock)
    waiting = add(index, pool, "waiting", clock)
    add(index, pool, "idle", clock)
    assert index.hold(["waiting", "gone"], clock.now + 30) == 1
    index.evict(1)
    assert "waiting" in index  # older, yet its agent's turn is due
    assert "idle" not in index
    clock.now += 60
    assert waiting.held_until < clock.now
    assert index.expire() == 0  # a hold that passed moves nothing


class Due:
    """Tool results expected in so many seconds, by agent (``ToolWaits.due_in``)."""

    def __init__(self, **due_in: float) -> None:
        self.seconds = due_in

    def due_in(self, namespace: str, agent_id: str) -> float | None:
        return self.seconds.get(agent_id)


def record(agent_id: str, last_used: float, retention: str | None = None) -> AgentRecord:
    return AgentRecord("ns", agent_id, ("k",), 1, "", last_used=last_used, retention=retention)


def test_the_disk_cuts_by_the_same_policy_as_memory() -> None:
    """Past its TTL first, then by priority, then whoever is expected back latest: an agent
    due back from its tools soon stays longer than one used since; pinned ones last."""
    now = 1_000.0
    records = [
        record("pinned", 10, '{"pinned": true}'),
        record("ttl-passed", 990, '{"ttl_seconds": 5}'),
        record("ttl-within", 500, '{"ttl_seconds": 3600}'),
        record("idle-long", 100),
        record("idle-short", 900),
        record("important", 50, '{"priority": 90}'),
        record("tool-soon", 200),
        record("tool-overdue", 950),
    ]
    due = Due(**{"tool-soon": 30.0, "tool-overdue": -5.0})
    order = [r.agent_id for r in AgentRecordOrder(due, lambda: now)(records)]
    assert order == [
        "ttl-passed",
        "idle-long",
        "idle-short",
        "tool-overdue",  # a hold that passed ranks as before: used at 950
        "important",
        "ttl-within",  # back, by its idleness, after 1,500
        "tool-soon",  # back at 1,030
        "pinned",
    ]
    assert [r.agent_id for r in lru_records(records)][:3] == ["important", "idle-long", "tool-soon"]
    assert lru_records(records)[-1].agent_id == "pinned"


@pytest.mark.parametrize(("eviction", "kept"), [("agent", True), ("lru", False)])
async def test_a_disk_quota_spares_an_agent_due_back_from_its_tools(
    eviction: str, kept: bool
) -> None:
    h = await started(Harness(quota=300, eviction=eviction))
    await h.ask([1, *SYSTEM[1:], 50], agent="waiting")
    whole = h.metadata.agent_rows[("default", "waiting")].block_keys
    h.store.hold_for_tools("default", "waiting", ["run_tests"], whole)
    for agent in range(5):
        await h.ask([agent + 2, *SYSTEM[1:], 60 + agent], agent=f"other{agent}")
    assert await h.metadata.total_block_bytes() <= 300
    assert (h.metadata.agent_rows[("default", "waiting")].block_keys == whole) is kept
