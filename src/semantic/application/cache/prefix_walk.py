"""Which stored blocks a prompt may restore: its chain of block keys, then the best tails.

The walk follows the prompt's block ids (memory first, then this instance's metadata, then
the shared tier's) while each stored block holds the prompt's own tokens; past the last
full match it offers the children of the last block that share the most tokens with the
rest, even if they end mid-block. It pins nothing: ``PrefixLookup`` does.
"""

from __future__ import annotations

from collections.abc import Sequence

from semantic.application.cache.chain import Candidate
from semantic.application.cache.hot_index import HotIndex
from semantic.application.cache.shared_tier import SharedTier
from semantic.domain.block_identity import chain_keys, chain_root
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.tokens import common_prefix
from semantic.ports.metadata_store import BlockRecord, BlockRecords

OTHER_TAILS = 3
"""Siblings, beyond the best match, that a prompt may try in place of a block of its chain
when the chain cannot restore its prefix (``PrefixLookup._restorable_tail``): siblings
are many where conversations share a long system prompt, and each one tried may be a read
from disk."""


class PrefixWalk:
    """Finds a prompt's candidate blocks in memory, in the metadata and the shared tier."""

    def __init__(
        self,
        spec: ModelCacheSpec,
        fingerprint: str,
        block_records: BlockRecords,
        hot: HotIndex,
        shared: SharedTier | None,
    ) -> None:
        self._spec = spec
        self._fingerprint = fingerprint
        self._block_records = block_records
        self._hot = hot
        self._shared = shared

    @property
    def block_tokens(self) -> int:
        return self._spec.block_tokens

    def root(self, namespace: str) -> str:
        """The key a namespace's chains hang from (ADR 0005)."""
        return chain_root(self._fingerprint, namespace)

    async def walk(self, namespace: str, prompt: Sequence[int]) -> list[Candidate]:
        """The prompt's stored chain of whole blocks, then its best stored tail."""
        size = self._spec.block_tokens
        root = self.root(namespace)
        keys = chain_keys(root, prompt, size)
        records = await self._block_records.blocks(keys)  # hot ones too: they may be evicted
        # before a request that waits pins them again, and then come back from disk
        records = await self._shared_records(namespace, keys, records)
        out: list[Candidate] = []
        parent = root
        for index, key in enumerate(keys):
            want = tuple(prompt[index * size : (index + 1) * size])
            hot = self._hot.get(key)
            record = records.get(key)
            if record is not None and record.quarantined:
                record = None
            if hot is not None and hot.tokens == want:
                out.append(Candidate(key, hot=hot, record=record, tokens=want))
            elif record is not None and record.tokens == want:
                out.append(Candidate(key, record=record, tokens=want))
            else:
                break
            parent = key
        rest = tuple(prompt[len(out) * size :])
        tails = await self.children_by_match(parent, rest) if rest else []
        return out + tails[:1]

    async def _shared_records(
        self, namespace: str, keys: list[str], records: dict[str, BlockRecord]
    ) -> dict[str, BlockRecord]:
        """Past the blocks this instance knows, those the shared tier holds: a prompt
        another instance answered (its metadata is not this one's) restores from there."""
        if self._shared is None:
            return records
        unknown = next(
            (i for i, k in enumerate(keys) if k not in records and self._hot.get(k) is None),
            len(keys),
        )
        if unknown == len(keys):
            return records
        return {**await self._shared.records(namespace, keys[unknown:]), **records}

    async def children_by_match(self, parent: str, rest: tuple[int, ...]) -> list[Candidate]:
        """``parent``'s stored children that share tokens with ``rest``, the most first
        (hot before cold among equals), the best and ``OTHER_TAILS`` more."""
        stored = {r.key: r for r in await self._block_records.children(parent) if not r.quarantined}
        hot = self._hot.children(parent)
        options = [
            Candidate(h.key, hot=h, record=stored.pop(h.key, None), tokens=h.tokens) for h in hot
        ]
        options += [Candidate(r.key, record=r, tokens=r.tokens) for r in stored.values()]
        ranked = sorted(
            ((common_prefix(c.tokens, rest), c.hot is not None, c) for c in options),
            key=lambda ranking: ranking[:2],
            reverse=True,
        )
        return [c for shared, _, c in ranked[: 1 + OTHER_TAILS] if shared > 0]
