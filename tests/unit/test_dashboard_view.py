"""The dashboard's read model over hand-written fakes: what it counts, sorts and scopes."""

from __future__ import annotations

import pytest

from semantic.application.cache.hot_index import CACHE_OWNER, HotBlock, HotIndex
from semantic.application.dashboard.turn_history import TurnHistory
from semantic.application.dashboard.view import Dashboard, PageQuery
from semantic.domain.block_pool import BlockPool
from semantic.domain.blocks import KVBlock
from semantic.domain.errors import AgentNotFoundError, InvalidRequestError
from semantic.domain.generation import FinishedRequest, RequestStats
from semantic.ports.metadata_store import AgentRecord, BlockRecord
from tests.unit.storage_fakes import FakeMetadataStore

POOL_BLOCK = 1000
NOW = 1_800_000_040.0  # 40 s into a minute


def block(key: str, namespace: str, nbytes: int = 5000) -> BlockRecord:
    return BlockRecord(key, "", namespace, (1,) * 256, nbytes, "sum")


def turn(
    namespace: str, agent: str, prompt: int, cached: int, *, ttft: float = 0.1, at: float = NOW
) -> FinishedRequest:
    stats = RequestStats(0.0, ttft, 0.1, cached, prompt - cached, 4)
    return FinishedRequest(namespace, agent, prompt, stats, ttft + 0.1, ttft, at)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


Books = tuple[FakeMetadataStore, HotIndex, TurnHistory, Clock]
POOL = BlockPool(64)


@pytest.fixture
def books() -> Books:
    clock = Clock()
    return FakeMetadataStore(), HotIndex(POOL), TurnHistory(clock=clock), clock


async def fill(metadata: FakeMetadataStore, hot: HotIndex) -> None:
    """Team a: ``lead`` (two blocks, the first in memory) forked as ``helper``; team b:
    ``solo`` with one block."""
    lead = AgentRecord("a", "lead", ("k1", "k2"), 500, "rules", keeps_transcript=True)
    await metadata.save_agent_blocks(lead, [block("k1", "a"), block("k2", "a")])
    await metadata.fork_agent("a", "lead", "helper", "rules")
    solo = AgentRecord("b", "solo", ("k3",), 256, None, keeps_transcript=True)
    await metadata.save_agent_blocks(solo, [block("k3", "b", nbytes=7000)])
    layers = tuple(
        KVBlock(POOL.allocate(CACHE_OWNER, layer)[0], layer, 0, 256, None) for layer in range(2)
    )
    hot.add(HotBlock("k1", "", 0, (), layers))


async def test_pages_sort_and_scope_the_agents(books: Books) -> None:
    metadata, hot, history, _ = books
    await fill(metadata, hot)
    history.on_finished(turn("b", "solo", 256, 0, ttft=0.5, at=NOW))
    history.on_finished(turn("b", "solo", 300, 256, ttft=0.1, at=NOW))
    dashboard = Dashboard(metadata, metadata, hot, history, pool_block_bytes=POOL_BLOCK)

    everyone = await dashboard.agents(None, PageQuery(sort="agent", descending=False))
    assert [(r.namespace, r.agent_id) for r in everyone.rows] == [
        ("a", "helper"),
        ("a", "lead"),
        ("b", "solo"),
    ]
    lead = everyone.rows[1]
    assert (lead.blocks, lead.memory_blocks, lead.disk_blocks) == (2, 1, 2)
    assert everyone.rows[0].forked_from == "lead"
    assert everyone.rows[2].cached_share == pytest.approx(256 / 556)

    by_share = await dashboard.agents(None, PageQuery(sort="cached_share"))
    assert by_share.rows[0].agent_id == "solo"  # agents without turns come after
    team_a = await dashboard.agents({"a"}, PageQuery(limit=1))
    assert (team_a.total, len(team_a.rows)) == (2, 1)
    assert {r.namespace for r in team_a.rows} == {"a"}
    found = await dashboard.agents(None, PageQuery(search="help"))
    assert [r.agent_id for r in found.rows] == ["helper"]


async def test_usage_counts_a_shared_block_once_per_namespace(books: Books) -> None:
    metadata, hot, history, _ = books
    await fill(metadata, hot)
    dashboard = Dashboard(metadata, metadata, hot, history, pool_block_bytes=POOL_BLOCK)
    usage = {u.namespace: u for u in await dashboard.usage(None)}
    assert (usage["a"].agents, usage["a"].memory_bytes, usage["a"].disk_bytes) == (
        2,
        2 * POOL_BLOCK,
        10_000,
    )
    assert (usage["b"].memory_bytes, usage["b"].disk_bytes) == (0, 7000)
    assert [u.namespace for u in await dashboard.usage({"b"})] == ["b"]


async def test_an_agents_detail_shows_its_lineage_and_shared_blocks(books: Books) -> None:
    metadata, hot, history, _ = books
    await fill(metadata, hot)
    dashboard = Dashboard(metadata, metadata, hot, history, pool_block_bytes=POOL_BLOCK)
    lead = await dashboard.agent("a", "lead")
    assert lead.forks == ("helper",)
    assert lead.sharing == ("helper",)
    assert lead.shared_blocks == 2
    assert [(b.in_memory, b.on_disk) for b in lead.blocks] == [(True, True), (False, True)]
    helper = await dashboard.agent("a", "helper")
    assert (helper.row.forked_from, helper.forks) == ("lead", ())
    solo = await dashboard.agent("b", "solo")
    assert (solo.shared_blocks, solo.sharing) == (0, ())
    with pytest.raises(AgentNotFoundError):
        await dashboard.agent("b", "lead")  # another tenant's agent is not found


def test_a_page_outside_its_bounds_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="sort"):
        PageQuery(sort="password")
    with pytest.raises(InvalidRequestError, match="limit"):
        PageQuery(limit=0)
    with pytest.raises(InvalidRequestError, match="offset"):
        PageQuery(offset=-1)


def test_the_hour_by_minute_keeps_namespaces_apart_and_forgets_the_hour_before(
    books: Books,
) -> None:
    _, _, history, clock = books
    history.on_finished(turn("a", "x", 100, 50, ttft=0.2, at=NOW - 90 * 60))  # before the hour
    history.on_finished(turn("a", "x", 100, 50, ttft=0.2, at=NOW - 30))
    history.on_finished(turn("a", "y", 100, 100, ttft=0.4, at=NOW - 20))
    history.on_finished(turn("b", "z", 100, 0, ttft=3.0, at=NOW - 10))
    everyone = history.last_hour()
    assert len(everyone) == 60
    last = everyone[-1]
    assert (last.requests, last.prompt_tokens, last.cached_tokens) == (3, 300, 150)
    assert last.ttft_p95_s == 3.0
    only_a = history.last_hour({"a"})[-1]
    assert (only_a.requests, only_a.hit_rate, only_a.ttft_p95_s) == (2, 0.75, 0.4)
    assert sum(m.requests for m in everyone) == 3
    clock.now += 61 * 60
    assert sum(m.requests for m in history.last_hour()) == 0


def test_recent_turns_are_bounded_per_agent_and_in_agents() -> None:
    history = TurnHistory(turns_per_agent=2, agents=2)
    for n in range(3):
        history.on_finished(turn("a", "x", 100, n, ttft=0.1, at=NOW + n))
    assert [t.stats.cached_tokens for t in history.recent("a", "x")] == [1, 2]
    history.on_finished(turn("a", "y", 100, 0, ttft=0.1, at=NOW))
    history.on_finished(turn("a", "z", 100, 0, ttft=0.1, at=NOW))
    assert history.recent("a", "x") == ()  # the least recently seen agent went first
    assert history.cached_shares() == {("a", "y"): 0.0, ("a", "z"): 0.0}
