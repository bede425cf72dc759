"""A namespace over its disk quota gives up its own blocks, never another's (ADR 0028).

After each save of the namespace: while its block files take more than its quota, cut its
least valuable agents (the eviction order, ``eviction_policy``: pinned ones last, and only
a quota takes a pinned agent's blocks), each down to what the agent just saved still shares with
it; then, if that is not enough, the end of the agent just saved, which keeps its prefix.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

from semantic.application.cache.eviction_policy import RecordOrder
from semantic.domain.quotas import NamespaceQuotas
from semantic.ports.metadata_store import AgentRecord, AgentRecords, BlockRecord, BlockRecords

Cut = Callable[[AgentRecord, Sequence[str]], Awaitable[None]]
"""Keep only the agent's first blocks while they are in the keys given (``DiskRoom.cut``)."""


class NamespaceRoom:
    def __init__(
        self,
        agent_records: AgentRecords,
        block_records: BlockRecords,
        quotas: NamespaceQuotas,
        cut: Cut,
        order: RecordOrder,
    ) -> None:
        self._agent_records = agent_records
        self._block_records = block_records
        self._quotas = quotas
        self._cut = cut
        self._order = order

    def limited(self) -> list[str]:
        """The namespaces with a disk quota."""
        return [ns for ns, quota in self._quotas.limited().items() if quota.disk_bytes is not None]

    async def enforce(
        self, namespace: str, agent_id: str | None, chain: Sequence[str] = ()
    ) -> None:
        """``agent_id``: the agent just saved (None at start: no one's); ``chain``: a save
        in flight, never cut."""
        quota = self._quotas.of(namespace).disk_bytes
        if quota is None or await self._used(namespace) <= quota:
            return
        mine = await self._agent_records.agents(namespace)
        newest = next((a for a in mine if a.agent_id == agent_id), None)
        kept = {*chain, *(newest.block_keys if newest else ())}
        others = [a for a in self._order(mine) if a is not newest]
        for agent in others:
            if await self._used(namespace) <= quota:
                return
            await self._cut(agent, [key for key in agent.block_keys if key in kept])
        if newest is not None and not chain:
            await self._cut_end(newest, namespace, quota)

    async def _cut_end(self, agent: AgentRecord, namespace: str, quota: int) -> None:
        records = await self._block_records.blocks(agent.block_keys)
        excess = await self._used(namespace) - quota
        await self._cut(agent, without_tail(agent.block_keys, records, excess))

    async def _used(self, namespace: str) -> int:
        return (await self._block_records.block_bytes_by_namespace()).get(namespace, 0)


def without_tail(keys: Sequence[str], records: Mapping[str, BlockRecord], excess: int) -> list[str]:
    """``keys`` less the unshared blocks at their end that free ``excess`` bytes (fewer, if
    a shared block comes first: what others hold is not freed by cutting it here)."""
    keep = list(keys)
    while keep and excess > 0 and keep[-1] in records and records[keep[-1]].ref_count <= 1:
        excess -= records[keep.pop()].nbytes
    return keep
