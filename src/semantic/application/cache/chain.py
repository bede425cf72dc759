"""Pinning a prompt's candidate blocks, and what the pinned chain restores.

A lookup (``PrefixLookup``) and a later re-pin (``StoredPlan``) both take the candidate
blocks a walk found, pin each one (from memory, else read from disk), keep the leading run
that pinned, and ask how much of the prompt that run can restore; this module is that part,
shared by both so the two agree block for block.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from semantic.application.cache.hot_index import HotBlock, HotIndex
from semantic.application.cache.loader import BlockLoader, LoadOutcome
from semantic.application.cache.stats import Restored
from semantic.application.engine.active_request import HeldPrefix
from semantic.domain.block_pool import BlockPool
from semantic.domain.blocks import AgentBlocks, KVBlock, restorable_prefix
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.tokens import reusable_prefix
from semantic.ports.metadata_store import BlockRecord

Fetched = HotBlock | LoadOutcome
"""A block pinned in memory, or why it could not be."""

Chain = list[tuple[HotBlock, bool]]
"""Pinned blocks in prompt order, each with whether it came from disk."""


@dataclass
class Candidate:
    """A stored block a prompt may restore: in memory (``hot``), on disk (``record``), or
    both; ``tokens`` are the prompt tokens it holds."""

    key: str
    hot: HotBlock | None = None
    record: BlockRecord | None = None
    tokens: tuple[int, ...] = field(default_factory=tuple)


class ChainPinner:
    """Pins candidates under an owner and measures what they restore."""

    def __init__(
        self, pool: BlockPool, spec: ModelCacheSpec, hot: HotIndex, loader: BlockLoader
    ) -> None:
        self._pool = pool
        self._spec = spec
        self._hot = hot
        self._loader = loader

    def fetch(self, candidate: Candidate, index: int, pin: str) -> Fetched:
        """Pin one candidate: from memory if it is still hot, else read from disk."""
        taken = self._hot.take(candidate.key, pin)
        if taken is not None:
            return taken
        if candidate.record is None:
            return LoadOutcome.GONE
        return self._loader.load(candidate.record, index, pin)

    def fetch_lane(self, candidates: list[Candidate], lane: range, pin: str) -> list[Fetched]:
        """A lane stops at its first block that could not be pinned: the prefix ends there
        (``chain``), and loading the blocks after it would only evict other agents' idle
        blocks to make room for blocks dropped at once."""
        out: list[Fetched] = []
        for index in lane:
            if out and not isinstance(out[-1], HotBlock):
                out.append(LoadOutcome.GONE)
            else:
                out.append(self.fetch(candidates[index], index, pin))
        return out

    def chain(
        self, candidates: list[Candidate], outcomes: list[Fetched], pin: str
    ) -> tuple[Chain, str | None]:
        """The leading run of candidates that were pinned or loaded, with whether each came
        from disk; blocks after the first failure are unpinned. Also returns the key of a
        block that failed verification, if one did."""
        chain: Chain = []
        corrupt: str | None = None
        failed = False
        for candidate, outcome in zip(candidates, outcomes, strict=True):
            if failed:
                if isinstance(outcome, HotBlock):
                    self._pool.release(pin, outcome.pool_ids())
                continue
            if isinstance(outcome, HotBlock):
                chain.append((outcome, candidate.hot is None))
                continue
            failed = True
            if outcome is LoadOutcome.CORRUPT and candidate.record is not None:
                corrupt = candidate.record.key
        return chain, corrupt

    def usable(self, blocks: AgentBlocks | None, prompt: Sequence[int]) -> int:
        """The prompt's tokens ``blocks`` match, cut to the prefix they can restore
        (``restorable_prefix``), which is all the engine restores."""
        if blocks is None:
            return 0
        return self.usable_of(HeldPrefix.of(blocks, prompt), len(prompt))

    def usable_of(self, held: HeldPrefix, prompt_tokens: int) -> int:
        """``usable`` from a match already made: the lookup hands the same match on to
        admission (``HeldPrefix``) rather than making it again."""
        reusable = reusable_prefix(held.matched, prompt_tokens)
        usable = restorable_prefix(held.blocks, reusable, self._spec)
        return held.matched if usable == reusable else usable

    def agent_blocks(self, chain: Chain) -> AgentBlocks | None:
        """A pinned chain as the blocks a request restores, layer by layer."""
        if not chain:
            return None
        tokens = tuple(itertools.chain.from_iterable(block.tokens for block, _ in chain))
        layers: list[tuple[KVBlock, ...]] = []
        for layer in range(self._spec.n_layers):
            held = (block.layers[layer] for block, _ in chain)
            layers.append(tuple(b for b in held if b is not None))
        return AgentBlocks("", tokens, tuple(layers))


def by_tier(chain: Chain) -> tuple[int, int]:
    """Tokens of a pinned chain that were hot, and that came from disk."""
    hot = sum(len(b.tokens) for b, from_disk in chain if not from_disk)
    return hot, sum(len(b.tokens) for b, _ in chain) - hot


def restored(chain: Chain, matched: int, prompt_tokens: int) -> Restored:
    """The matched tokens of a pinned chain, shared between the tiers its blocks came from."""
    hot, disk = by_tier(chain)
    share = matched / max(1, hot + disk)
    hit = reusable_prefix(matched, prompt_tokens)
    return Restored(hit, round(hot * share), round(disk * share))
