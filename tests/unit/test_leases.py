"""This instance's side of the agents' leases (``AgentLeases``) and the saves fenced by them,
against fakes at the lease and metadata ports (ADR 0025)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from semantic.adapters.http.errors import body_for, headers_for, problem_for
from semantic.application.agents.leases import AgentLeases, LeaseConfig, instance_holder
from semantic.domain.errors import AgentBusyError, LeaseLostError
from semantic.ports.leases import Lease
from tests.unit.storage_fakes import FakeMetadataStore
from tests.unit.test_cache_store import SYSTEM, Harness, started

NS, AGENT = "default", "a"
DEADLINE_S = 5.0


@dataclass
class FakeLeaseStore:
    """Busy for the first ``busy_for`` takes (another instance holds the agent), with
    ``left`` seconds of its lease to report; ``lost``: renewals find the lease taken."""

    busy_for: int = 0
    left: float = 7.0
    lost: bool = False
    takes: int = 0
    renewals: int = 0
    released: list[Lease] = field(default_factory=list)

    async def take(self, namespace: str, agent_id: str, holder: str, seconds: float) -> Lease:
        self.takes += 1
        if self.takes <= self.busy_for:
            raise AgentBusyError(agent_id, namespace, self.left)
        return Lease(namespace, agent_id, holder, self.takes)

    async def renew(self, lease: Lease, seconds: float) -> None:
        self.renewals += 1
        if self.lost:
            raise LeaseLostError(lease.agent_id, lease.namespace)

    async def release(self, lease: Lease) -> None:
        self.released.append(lease)


@dataclass
class FakeTime:
    """A clock that only the waits move on: the waits are recorded, never slept."""

    now: float = 0.0
    waits: list[float] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def leases(store: FakeLeaseStore, time: FakeTime, wait_s: float = 1.0) -> AgentLeases:
    config = LeaseConfig(seconds=30.0, wait_s=wait_s, first_poll_s=0.05, max_poll_s=0.4)
    return AgentLeases(store, "me", config, clock=time.clock, pause=time.sleep)


async def test_a_lease_another_instance_lets_go_is_waited_for_with_growing_pauses() -> None:
    store, time = FakeLeaseStore(busy_for=4), FakeTime()
    agent_leases = leases(store, time)
    async with agent_leases.holding(NS, AGENT) as lease:
        assert lease == Lease(NS, AGENT, "me", 5)
        assert agent_leases.held(NS, AGENT) == lease
    assert time.waits == pytest.approx([0.05, 0.1, 0.2, 0.4])
    assert store.released == [lease]
    assert agent_leases.held(NS, AGENT) is None


async def test_a_lease_held_past_the_wait_is_a_busy_error_with_the_others_time_left() -> None:
    store, time = FakeLeaseStore(busy_for=1000, left=7.0), FakeTime()
    with pytest.raises(AgentBusyError, match="busy on another instance") as busy:
        async with leases(store, time, wait_s=1.0).holding(NS, AGENT):
            pytest.fail("the block ran without the lease")
    assert busy.value.retry_after_s == 7.0
    assert time.now == pytest.approx(1.0), "it waited the whole wait, and no longer"
    assert max(time.waits) <= 0.4
    assert not store.released


async def test_no_wait_refuses_at_the_first_try() -> None:
    store, time = FakeLeaseStore(busy_for=1), FakeTime()
    with pytest.raises(AgentBusyError):
        async with leases(store, time, wait_s=0.0).holding(NS, AGENT):
            pass
    assert store.takes == 1
    assert time.waits == []


async def test_overlapping_requests_of_one_agent_share_its_lease_and_let_it_go_once() -> None:
    store, time = FakeLeaseStore(), FakeTime()
    agent_leases = leases(store, time)
    async with contextlib.AsyncExitStack() as stack:
        first = await stack.enter_async_context(agent_leases.holding(NS, AGENT))
        second = await stack.enter_async_context(agent_leases.holding(NS, AGENT))
        other = await stack.enter_async_context(agent_leases.holding(NS, "b"))
        assert first == second
        assert other.agent_id == "b"
        assert store.takes == 2
    assert sorted(lease.agent_id for lease in store.released) == [AGENT, "b"]


async def wait_for(condition: Callable[[], bool]) -> None:
    """Polls ``condition`` with a deadline (no timing assert: only that it comes true)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not condition():
        assert loop.time() < deadline, "the condition never came true"
        await asyncio.sleep(0.005)


async def test_a_held_lease_is_renewed_until_it_is_lost() -> None:
    store = FakeLeaseStore()
    agent_leases = AgentLeases(store, "me", LeaseConfig(seconds=0.03, wait_s=0.0))
    async with agent_leases.holding(NS, AGENT):
        await wait_for(lambda: store.renewals >= 2)
        store.lost = True
        await wait_for(lambda: store.renewals >= 3)
        renewals = store.renewals
        await asyncio.sleep(0.05)  # a lost lease is not renewed again (not a timing assert)
        assert store.renewals == renewals
    assert len(store.released) == 1


def test_an_instances_name_is_host_pid_and_a_random_part() -> None:
    first, second = instance_holder(), instance_holder()
    assert first != second
    host, pid, _ = first.split(":")
    assert host
    assert pid.isdigit()


async def test_an_agents_chain_is_saved_under_its_lease_and_not_once_the_lease_is_lost() -> None:
    metadata = FakeMetadataStore()
    lease = Lease(NS, AGENT, "me", 3)
    h = await started(
        Harness(metadata=metadata, lease_of=lambda _, a: lease if a == AGENT else None)
    )
    await h.ask([*SYSTEM, 11, 12])
    assert metadata.write_leases == [lease]
    await h.ask([*SYSTEM, 20, 21], agent="plain")
    assert metadata.write_leases[-1] is None, "an agent no turn leased is saved as before"

    metadata.lost.add((NS, AGENT))
    before = (dict(metadata.agent_rows), dict(metadata.block_rows), set(h.block_store.files))
    failed = h.store.stats.saves_failed
    await h.ask([*SYSTEM, 11, 12, 30, 31, 32, 33, 34])
    assert h.store.stats.saves_failed == failed + 1
    after = (dict(metadata.agent_rows), dict(metadata.block_rows), set(h.block_store.files))
    assert after == before, "the refused save left no row and no file"


@pytest.mark.parametrize("path", ["/v1/agents/a/messages", "/v1/chat/completions", "/v1/messages"])
def test_a_busy_agent_is_a_409_with_retry_after_in_the_routes_shape(path: str) -> None:
    problem = problem_for(AgentBusyError(AGENT, NS, 4.2))
    assert (problem.status, problem.kind) == (409, "agent_busy")
    assert headers_for(problem) == {"Retry-After": "4"}
    body = body_for(path, problem)
    if path == "/v1/messages":  # Anthropic's shape
        assert body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
    else:
        assert body["error"]["code"] == "agent_busy"
        assert body["error"]["type"] == "conflict_error"
    assert "busy on another instance" in str(body)


def test_a_lost_lease_is_a_409_saying_the_turn_was_not_kept() -> None:
    problem = problem_for(LeaseLostError(AGENT, NS))
    assert (problem.status, problem.kind) == (409, "lease_lost")
    assert "nothing of the turn was kept" in problem.message
