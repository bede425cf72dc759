"""Which stored conversation a request without an agent continues.

A request without an agent id is still a conversation whose KV is worth keeping. Its record
is chosen when its blocks are saved, in save order, so a turn always finds the turn before it:
the longest anonymous record whose tokens are a prefix of what is saved now is that same
conversation earlier on, and is replaced (the new block list covers every token it had). Any
other conversation, even one sharing a long system prompt, gets a record of its own, so saving
one never drops another's blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

from semantic.application.cache.hot_index import HotBlock
from semantic.ports.metadata_store import AgentRecord, MetadataStore

ANONYMOUS_AGENT = "~anon"
"""The agent of a request without one: ``~`` can never start a client's agent id."""

ANONYMOUS_PREFIX = ANONYMOUS_AGENT + "-"
"""Stored anonymous records' ids start with this."""


async def conversation_id(
    metadata: MetadataStore, namespace: str, chain: Sequence[HotBlock]
) -> str:
    """The id to save ``chain`` under: the conversation it continues, or a new one named
    after its whole chain (two identical conversations are one record)."""
    keys = [block.key for block in chain]
    ends = await _prefix_ends(metadata, chain)
    records = await metadata.anonymous_agents_ending_at(namespace, list(ends))
    earlier = [r for r in records if _is_prefix(r, keys, ends)]
    if earlier:
        return max(earlier, key=lambda r: (r.token_count, r.last_used)).agent_id
    return ANONYMOUS_PREFIX + (keys[-1][:24] if keys else "empty")


async def _prefix_ends(metadata: MetadataStore, chain: Sequence[HotBlock]) -> dict[str, int]:
    """Stored blocks a shorter conversation could end with, by their position in ``chain``:
    each block of the chain, and at each position the stored siblings whose tokens begin
    that block's (a partial block this chain has since filled further)."""
    ends: dict[str, int] = {}
    for index, block in enumerate(chain):
        for sibling in await metadata.children(block.parent):
            if block.tokens[: len(sibling.tokens)] == sibling.tokens:
                ends[sibling.key] = index
    return ends


def _is_prefix(record: AgentRecord, keys: Sequence[str], ends: dict[str, int]) -> bool:
    last = len(record.block_keys) - 1
    return ends.get(record.block_keys[-1]) == last and list(record.block_keys[:-1]) == keys[:last]
