"""Agents' leases and fenced writes on a real database, SQLite and PostgreSQL: two stores on
one database stand in for two instances sharing it (ADR 0025). The lease clock is a plain
number the tests move on, so expiry needs no waiting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from semantic.adapters.storage.sql_leases import SqlLeases
from semantic.adapters.storage.sql_metadata import SqlMetadataStore
from semantic.adapters.storage.sqlite_objects import SqliteObjectStore
from semantic.domain.errors import AgentBusyError, LeaseLostError
from semantic.ports.leases import Lease
from semantic.ports.metadata_store import AgentRecord, BlockRecord, MessageRecord
from semantic.ports.object_store import StoredObject
from tests.integration.conftest import StoreFactory

NS, AGENT, SECONDS = "ns", "helper", 10.0

pytestmark = pytest.mark.asyncio(loop_scope="session")  # the loop the stores opened on


@dataclass
class Clock:
    now: float = 1_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Instance:
    metadata: SqlMetadataStore
    leases: SqlLeases
    holder: str

    async def take(self, agent_id: str = AGENT) -> Lease:
        return await self.leases.take(NS, agent_id, self.holder, SECONDS)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def pair(new_store: StoreFactory, clock: Clock) -> AsyncIterator[tuple[Instance, Instance]]:
    """Two instances on one database: a SQLite file, or a PostgreSQL database."""
    instances = []
    for holder in ("host-a:1:aaaa", "host-b:2:bbbb"):
        metadata = new_store()
        await metadata.open()
        instances.append(Instance(metadata, SqlLeases(metadata.engine, clock), holder))
    yield instances[0], instances[1]
    for instance in instances:
        await instance.metadata.close()


def block(key: str, parent: str = "root") -> BlockRecord:
    return BlockRecord(key, parent, NS, (1, 2, 3), 100, "sum")


async def test_a_lease_is_one_holders_until_it_expires_then_the_epoch_rises(
    pair: tuple[Instance, Instance], clock: Clock
) -> None:
    a, b = pair
    first = await a.take()
    assert first == Lease(NS, AGENT, a.holder, 1)
    assert await a.take() == first, "taking again one's own lease keeps its epoch"
    clock.now += 4
    with pytest.raises(AgentBusyError) as busy:
        await b.take()
    assert busy.value.retry_after_s == pytest.approx(SECONDS - 4)
    assert "busy on another instance" in str(busy.value)
    clock.now += SECONDS
    second = await b.take()
    assert second == Lease(NS, AGENT, b.holder, 2)
    with pytest.raises(LeaseLostError):
        await a.leases.renew(first, SECONDS)
    await a.leases.release(first)  # a lost lease's release lets nothing go
    with pytest.raises(AgentBusyError):
        await a.take()
    assert await b.take() == second


async def test_a_renewed_lease_lasts_and_a_released_one_is_free_at_once(
    pair: tuple[Instance, Instance], clock: Clock
) -> None:
    a, b = pair
    lease = await a.take()
    clock.now += SECONDS - 1
    await a.leases.renew(lease, SECONDS)
    clock.now += SECONDS - 1  # past the first expiry, within the renewed one
    with pytest.raises(AgentBusyError):
        await b.take()
    await a.leases.release(lease)
    assert await b.take() == Lease(NS, AGENT, b.holder, 2)
    other = await a.take("other")
    assert other.epoch == 1, "each agent has its own lease"


async def test_of_two_instances_taking_a_new_agent_at_once_one_wins(
    pair: tuple[Instance, Instance],
) -> None:
    a, b = pair
    for round_ in range(5):
        agent_id = f"new-{round_}"
        results = await asyncio.gather(a.take(agent_id), b.take(agent_id), return_exceptions=True)
        leases = [r for r in results if isinstance(r, Lease)]
        refused = [r for r in results if isinstance(r, AgentBusyError)]
        assert len(leases) == 1, results
        assert len(refused) == 1, results
        assert leases[0].epoch == 1


async def test_writes_under_a_stale_epoch_are_refused_and_keep_nothing(
    pair: tuple[Instance, Instance], clock: Clock
) -> None:
    """The paused instance's turn: ``a`` held the agent, paused past its lease, ``b`` took
    it and wrote a turn; ``a``'s transcript, chain and delete are then all refused."""
    a, b = pair
    await a.metadata.create_agent(AgentRecord(NS, AGENT, keeps_transcript=True))
    stale = await a.take()
    await a.metadata.save_agent_blocks(
        AgentRecord(NS, AGENT, ("k1",), 3), [block("k1")], lease=stale
    )
    await a.metadata.append_messages(NS, AGENT, [MessageRecord("user", "one")], lease=stale)
    clock.now += SECONDS + 1
    fresh = await b.take()
    await b.metadata.append_messages(NS, AGENT, [MessageRecord("user", "two")], lease=fresh)
    await b.metadata.save_agent_blocks(
        AgentRecord(NS, AGENT, ("k1", "k2"), 6), [block("k2", "k1")], lease=fresh
    )

    with pytest.raises(LeaseLostError, match="lost agent 'helper'"):
        await a.metadata.append_messages(
            NS,
            AGENT,
            [MessageRecord("user", "forked"), MessageRecord("assistant", "x")],
            lease=stale,
        )
    with pytest.raises(LeaseLostError):
        await a.metadata.save_agent_blocks(
            AgentRecord(NS, AGENT, ("k1", "k9"), 6), [block("k9", "k1")], lease=stale
        )
    with pytest.raises(LeaseLostError):
        await a.metadata.delete_agent(NS, AGENT, lease=stale)

    for reader in (a.metadata, b.metadata):
        assert [m.content for m in await reader.messages(NS, AGENT)] == ["one", "two"]
        record = await reader.agent(NS, AGENT)
        assert record is not None
        assert record.block_keys == ("k1", "k2")
    assert await a.metadata.all_block_keys() == {"k1", "k2"}, "no row of the refused save"
    assert "k9" not in await a.metadata.blocks(["k9"]), "nor in the lookups' copy"


async def test_a_delete_under_the_lease_ends_it_and_no_lease_means_no_check(
    pair: tuple[Instance, Instance],
) -> None:
    a, b = pair
    await a.metadata.create_agent(AgentRecord(NS, AGENT, keeps_transcript=True))
    lease = await a.take()
    await a.metadata.append_messages(NS, AGENT, [MessageRecord("user", "hi")])  # one instance
    await a.metadata.delete_agent(NS, AGENT, lease=lease)
    assert await b.metadata.agent(NS, AGENT) is None
    with pytest.raises(LeaseLostError):  # its lease went with it
        await a.metadata.append_messages(NS, AGENT, [MessageRecord("user", "late")], lease=lease)
    assert await b.take() == Lease(NS, AGENT, b.holder, 1), "a new agent of that id is free"


async def test_a_cut_read_before_another_instances_turn_leaves_that_turns_chain(
    pair: tuple[Instance, Instance],
) -> None:
    """``a``'s disk room read the agent's chain, ``b`` saved a turn of it meanwhile; the
    cut of what ``a`` read changes nothing (the database compares the chain, in the cut's
    transaction), where before it put the old chain back and orphaned the turn's blocks."""
    a, b = pair
    first = [block("k1"), block("k2", "k1")]
    await a.metadata.save_agent_blocks(AgentRecord(NS, AGENT, ("k1", "k2"), 6), first)
    read = await a.metadata.agent(NS, AGENT)
    assert read is not None
    await b.metadata.save_agent_blocks(
        AgentRecord(NS, AGENT, ("k1", "k2", "k3"), 9), [block("k3", "k2")]
    )
    shorter = AgentRecord(NS, AGENT, ("k1",), 3)
    assert await a.metadata.save_agent_blocks(shorter, [], expected=read.block_keys) == []
    assert await a.metadata.delete_agent(NS, AGENT, expected=read.block_keys) == []
    record = await b.metadata.agent(NS, AGENT)
    assert record is not None
    assert record.block_keys == ("k1", "k2", "k3")
    assert await b.metadata.all_block_keys() == {"k1", "k2", "k3"}
    now = await a.metadata.agent(NS, AGENT)
    assert now is not None
    cut = await a.metadata.save_agent_blocks(shorter, [], expected=now.block_keys)
    assert set(cut) == {"k2", "k3"}, "a cut of the chain as it is goes through"


async def test_a_responses_objects_under_a_stale_lease_are_refused_and_keep_nothing(
    pair: tuple[Instance, Instance], clock: Clock
) -> None:
    """A paused instance's response commits its objects after its turn: refused by the
    database once another instance holds that agent, so no response names a turn that
    instance's transcript does not have."""
    a, b = pair
    stale = await a.take()
    clock.now += SECONDS + 1
    fresh = await b.take()
    objects = SqliteObjectStore(a.metadata)
    response = StoredObject("response", "resp_1", "{}")
    with pytest.raises(LeaseLostError):
        await objects.put_objects(NS, [response, StoredObject("item", "i1", "{}")], lease=stale)
    assert await objects.stored_object(NS, "response", "resp_1") is None
    await SqliteObjectStore(b.metadata).put_objects(NS, [response], lease=fresh)
    assert await objects.stored_object(NS, "response", "resp_1") is not None
