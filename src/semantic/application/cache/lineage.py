"""Which stored records a save continues, and which it must keep beside it.

A request without an agent id is still a conversation whose KV is worth keeping. Its record
is chosen when its blocks are saved, in save order, so a turn always finds the turn before it:
the longest anonymous record whose tokens are a prefix of what is saved now is that same
conversation earlier on, and is replaced (the new block list covers every token it had). Any
other conversation, even one sharing a long system prompt, gets a record of its own, so saving
one never drops another's blocks.

An agent whose new turn does not extend its stored one (an edited history, a regenerated
reply) has branched: its old block list is kept as a branch record of that agent, found by
prompt like an anonymous one, so going back to the old branch is still a hit. A branch the
agent's record grows to cover again is dropped, and deleting the agent deletes its branches.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from semantic.application.cache.hot_index import HotBlock
from semantic.ports.metadata_store import AgentRecord, AgentRecords, BlockRecords

ANONYMOUS_AGENT = "~anon"
"""The agent of a request without one: ``~`` can never start a client's agent id."""

ANONYMOUS_PREFIX = ANONYMOUS_AGENT + "-"
"""Stored anonymous conversations' ids start with this."""


def branch_prefix(agent_id: str) -> str:
    """Ids of an agent's branch records start with this (``:`` is never in an agent id)."""
    return f"~branch:{agent_id}:"


@dataclass(frozen=True)
class Lineage:
    """What is stored of the chain about to be saved: anonymous and branch records whose
    tokens are a prefix of it."""

    keys: list[str]
    ends: dict[str, int]
    prefixes: list[AgentRecord]

    def conversation_id(self) -> str:
        """The anonymous conversation this chain continues (an identical one too: two equal
        conversations are one record), or a new one. A new id is never derived from the
        chain: a record keeps its id as it grows, so a later conversation equal to its first
        turn would take that id, and with it the record's blocks."""
        earlier = [r for r in self.prefixes if r.agent_id.startswith(ANONYMOUS_PREFIX)]
        if earlier:
            return max(earlier, key=lambda r: (r.token_count, r.last_used)).agent_id
        return ANONYMOUS_PREFIX + uuid.uuid4().hex

    def extends(self, record: AgentRecord) -> bool:
        """Whether the chain covers every token of ``record``."""
        return _covers(self.keys, self.ends, record)

    def covered_branches(self, agent_id: str) -> list[AgentRecord]:
        """The agent's branch records this chain has grown to cover again."""
        return [r for r in self.prefixes if r.agent_id.startswith(branch_prefix(agent_id))]


def branch_id(record: AgentRecord) -> str:
    """The id to keep ``record``'s block list under once its agent has moved on."""
    return branch_prefix(record.agent_id) + (
        record.block_keys[-1][:24] if record.block_keys else ""
    )


async def lineage(
    agent_records: AgentRecords,
    block_records: BlockRecords,
    namespace: str,
    chain: Sequence[HotBlock],
) -> Lineage:
    keys = [block.key for block in chain]
    ends = await _prefix_ends(block_records, chain)
    records = await agent_records.anonymous_agents_ending_at(namespace, list(ends))
    return Lineage(keys, ends, [r for r in records if _covers(keys, ends, r)])


def _covers(keys: list[str], ends: dict[str, int], record: AgentRecord) -> bool:
    """Whether a chain of ``keys`` holds every token of ``record``: the same blocks up to
    its last, which is the chain's block at that place or a stored beginning of it."""
    if not record.block_keys:
        return True
    last = len(record.block_keys) - 1
    whole = list(record.block_keys[:-1]) == keys[:last]
    return whole and ends.get(record.block_keys[-1]) == last


async def _prefix_ends(block_records: BlockRecords, chain: Sequence[HotBlock]) -> dict[str, int]:
    """Stored blocks a shorter conversation could end with, by their position in ``chain``:
    each block of the chain, and at each position the stored siblings whose tokens begin
    that block's (a partial block this chain has since filled further)."""
    ends: dict[str, int] = {}
    for index, block in enumerate(chain):
        for sibling in await block_records.children(block.parent):
            if block.tokens[: len(sibling.tokens)] == sibling.tokens:
                ends[sibling.key] = index
    return ends
