"""Hard limits per namespace: a tenant over its quota gives up its own KV, in memory and on
disk, never another tenant's (ADR 0028)."""

from __future__ import annotations

import pytest

from semantic.application.cache.hot_index import CACHE_OWNER, HotBlock, HotIndex
from semantic.domain.block_pool import BlockPool
from semantic.domain.blocks import KVBlock
from semantic.domain.errors import InvalidRequestError
from semantic.domain.quotas import MIB, NamespaceQuotas, Quota
from tests.unit.test_cache_store import SYSTEM, Harness, started

BLOCK = 4 * MIB


def test_quotas_are_read_in_mib_and_refused_by_name() -> None:
    quotas = NamespaceQuotas.parse(
        '{"team-a": {"memory_mb": 8, "disk_mb": 16, "shared_mb": 32}}', BLOCK
    )
    assert quotas.of("team-a") == Quota(8 * MIB, 16 * MIB, 32 * MIB)
    assert quotas.of("team-b") == Quota()  # no quota
    refusals = {
        '{"team-a": {"disk_mb": 1}}': "team-a.disk_mb",  # less than one block
        '{"team-a": {"shared_mb": 0.5}}': "team-a.shared_mb",
        '{"team-a": {"memory_mb": "lots"}}': "team-a.memory_mb",
        '{"team-a": {"gpu_mb": 8}}': "team-a",
        '{"team-a": {}}': "team-a",
    }
    for text, field in refusals.items():
        with pytest.raises(InvalidRequestError) as refused:
            NamespaceQuotas.parse(text, BLOCK)
        assert refused.value.param == field, text
    with pytest.raises(InvalidRequestError, match="JSON"):
        NamespaceQuotas.parse("team-a: 8", BLOCK)


def test_the_quotas_file_and_the_keys_file_agree_or_the_server_does_not_start() -> None:
    filed = NamespaceQuotas.parse('{"team-a": {"disk_mb": 16}}', BLOCK)
    keyed = NamespaceQuotas.of_mapping({"team-b": {"memory_mb": 8}}, BLOCK)
    both = filed.with_others(keyed)
    assert (both.of("team-a"), both.of("team-b")) == (Quota(None, 16 * MIB), Quota(8 * MIB))
    assert filed.with_others(filed).of("team-a") == Quota(None, 16 * MIB)
    with pytest.raises(InvalidRequestError, match="two different quotas") as refused:
        filed.with_others(NamespaceQuotas.of_mapping({"team-a": {"disk_mb": 32}}, BLOCK))
    assert refused.value.param == "team-a"


def test_a_namespace_over_its_memory_quota_gives_up_its_own_blocks_only() -> None:
    pool = BlockPool(32)
    index = HotIndex(pool)
    for namespace in ("a", "b"):
        for n in range(4):
            layer = KVBlock(pool.allocate(CACHE_OWNER, 0)[0], 0, n, 4, None)
            key = f"{namespace}{n}"
            index.add(HotBlock(key, "", n, (1, 2, 3, 4), (layer,), namespace=namespace))
            index.mark_persisted([key])
    assert index.trim("a", 1) == 3
    assert index.pool_blocks_by_namespace() == {"a": 1, "b": 4}
    assert "a3" in index  # the most recently used of a's stays


async def test_a_tenant_filling_its_disk_quota_never_cuts_another_tenants_blocks() -> None:
    quotas = NamespaceQuotas({"greedy": Quota(disk_bytes=150)})
    h = await started(Harness(quotas=quotas))
    await h.ask([1, *SYSTEM[1:], 50], agent="calm", namespace="quiet")
    calm = h.metadata.agent_rows[("quiet", "calm")].block_keys
    for agent in range(8):
        await h.ask([agent + 2, *SYSTEM[1:], 30 + agent], agent=f"g{agent}", namespace="greedy")
    used = await h.metadata.block_bytes_by_namespace()
    assert used["greedy"] <= 150
    assert h.metadata.agent_rows[("quiet", "calm")].block_keys == calm  # untouched
    assert set(calm) <= set(h.block_store.files)
    assert h.metadata.agent_rows[("greedy", "g7")].block_keys  # the newest kept its prefix


async def test_memory_pressure_takes_a_namespace_over_its_quota_first() -> None:
    """Before the sweep trims it (an hour away here), a tenant over its memory quota pays
    for the memory others ask for; the others' blocks stay."""
    quotas = NamespaceQuotas({"greedy": Quota(memory_bytes=1)})  # below one block: all over
    h = await started(Harness(quotas=quotas, sweep_s=3600))
    await h.ask([1, *SYSTEM[1:], 50], agent="calm", namespace="quiet")
    await h.ask([2, *SYSTEM[1:], 51], agent="g", namespace="greedy")
    held = h.store.hot.pool_blocks_by_namespace()
    assert held["greedy"] > 0
    assert h.store.reclaim(1) >= held["greedy"]
    after = h.store.hot.pool_blocks_by_namespace()
    assert after.get("greedy", 0) == 0
    assert after["quiet"] == held["quiet"]  # plain LRU would have taken quiet's, older


async def test_a_quota_lowered_across_a_restart_holds_from_the_start() -> None:
    """Not from the tenant's next save: its files over the new quota go as the server
    starts, the least valuable agents' first, and another tenant's stay."""
    before = await started(Harness())
    await before.ask([1, *SYSTEM[1:], 50], agent="calm", namespace="quiet")
    for agent in range(4):
        await before.ask([agent + 2, *SYSTEM[1:], 30 + agent], agent=f"g{agent}", namespace="big")
    await before.store.close()
    calm = before.metadata.agent_rows[("quiet", "calm")].block_keys
    used = await before.metadata.block_bytes_by_namespace()
    lowered = NamespaceQuotas({"big": Quota(disk_bytes=used["big"] // 2)})
    after = await started(
        Harness(block_store=before.block_store, metadata=before.metadata, quotas=lowered)
    )
    held = await after.metadata.block_bytes_by_namespace()
    assert held["big"] <= used["big"] // 2
    assert held["quiet"] == used["quiet"]
    assert after.metadata.agent_rows[("quiet", "calm")].block_keys == calm
    assert after.metadata.agent_rows[("big", "g3")].block_keys  # the newest kept its blocks
