"""The asyncio side's lookup: pin the longest stored prefix of a prompt.

The walk (``PrefixWalk``) names the candidate blocks; their reads are spread over the
reader lanes (``read_lanes``); the leading run that pinned is the prefix, its last block or
two swapped for siblings when those restore more (``_restorable_tail``). Every path out of
here, a cancelled caller included, either hands the pins over in a ``CachedPrefix`` or lets
them go: nothing else would.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from semantic.application.cache.chain import Candidate, Chain, ChainPinner, by_tier, restored
from semantic.application.cache.hot_index import HotBlock
from semantic.application.cache.loader import BlockLoader
from semantic.application.cache.prefix_walk import PrefixWalk
from semantic.application.cache.read_lanes import LaneReaders, in_order, read_lanes, when_all_done
from semantic.application.cache.stats import CacheStats
from semantic.application.cache.stored_plan import StoredPlan
from semantic.application.engine.active_request import HeldPrefix, StoredPrefix
from semantic.domain.block_pool import BlockPool
from semantic.domain.blocks import AgentBlocks
from semantic.domain.tokens import common_prefix, reusable_prefix

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CachedPrefix:
    """What a prompt can restore. ``held``'s blocks are pinned under ``pin`` until
    released, with the match the lookup made, which admission uses as is; ``stored`` pins
    the whole stored prefix again later (None when nothing is stored)."""

    held: HeldPrefix | None
    pin: str
    hot_tokens: int
    disk_tokens: int
    matched_tokens: int
    """The prompt's tokens the blocks can restore (``ChainPinner.usable``)."""
    stored: StoredPrefix | None = None

    @property
    def blocks(self) -> AgentBlocks | None:
        return None if self.held is None else self.held.blocks


class PrefixLookup:
    """``AgentCacheStore.prepare``: the walk, the pinning reads, the prefix they give."""

    def __init__(
        self,
        pool: BlockPool,
        stats: CacheStats,
        loader: BlockLoader,
        *,
        walk: PrefixWalk,
        pinner: ChainPinner,
        plan: StoredPlan,
    ) -> None:
        self._pool = pool
        self._stats = stats
        self._loader = loader
        self._walk = walk
        self._pinner = pinner
        self._plan = plan
        self._pins = itertools.count(1)
        self._readers = LaneReaders()

    def shutdown(self) -> None:
        """Stop the reader threads."""
        self._readers.shutdown()

    async def prepare(self, namespace: str, prompt: Sequence[int]) -> CachedPrefix:
        """Pin the longest stored prefix of ``prompt`` (loading disk blocks into memory)."""
        pin = f"pin-{next(self._pins)}"
        self._stats.queried_tokens += len(prompt)
        candidates = await self._walk.walk(namespace, prompt)
        chain, corrupt = await self._read(candidates, pin)
        if corrupt is not None:
            await self._quarantine(corrupt, pin)
        if len(chain) == len(candidates):
            chain, candidates = await self._restorable_tail(
                chain, candidates, prompt, self._walk.root(namespace), pin
            )
        hot_tokens, disk_tokens = by_tier(chain)
        blocks = self._pinner.agent_blocks(chain)
        held = None if blocks is None else HeldPrefix.of(blocks, prompt)
        matched = 0 if held is None else self._pinner.usable_of(held, len(prompt))
        counted = restored(chain, matched, len(prompt))
        self._stats.count_restore(counted)
        good = list(itertools.takewhile(lambda c: c.key != corrupt, candidates))
        stored = self._plan.stored(good, prompt, asyncio.get_running_loop(), counted)
        return CachedPrefix(held, pin, hot_tokens, disk_tokens, matched, stored)

    async def _read(self, candidates: list[Candidate], pin: str) -> tuple[Chain, str | None]:
        """Pin the candidates over the reader lanes; the chain that pinned, and the key of
        a block that failed verification, if one did."""
        lanes = read_lanes(len(candidates))
        fetches = [
            self._readers.submit(index, self._pinner.fetch_lane, candidates, lane, pin)
            for index, lane in enumerate(lanes)
        ]
        fetched = asyncio.wrap_future(when_all_done(fetches))
        try:
            await asyncio.shield(fetched)
            outcomes = in_order(lanes, [f.result() for f in fetches])
            return self._pinner.chain(candidates, outcomes, pin)
        except BaseException:  # the caller went away, or a read failed: unpin what it pinned
            fetched.add_done_callback(self._unpin_when_fetched(pin, fetches))
            raise

    async def _quarantine(self, corrupt: str, pin: str) -> None:
        """Set a block that failed verification aside; the prefix ends before it."""
        try:
            await self._loader.quarantine(corrupt)
        except Exception as error:  # noqa: BLE001 - the request recomputes from there anyway
            log.warning("could not quarantine block %s: %s", corrupt[:16], error)
        except BaseException:  # the caller went away meanwhile: nobody will release it
            self._pool.release_owner(pin)
            raise

    def _unpin_when_fetched(
        self, pin: str, fetches: list[Future[Any]]
    ) -> Callable[[asyncio.Future[Any]], None]:
        """A restore nobody waits for any more still runs to its end on the reader threads
        (a read cannot be interrupted); then what it pinned is let go, and a read that
        failed meanwhile is logged (nobody else will see it)."""

        def unpin(_: asyncio.Future[Any]) -> None:
            for fetch in fetches:
                if not fetch.cancelled() and fetch.exception() is not None:
                    log.warning("a block read failed: %s", fetch.exception())
            self._pool.release_owner(pin)

        return unpin

    async def _restorable_tail(
        self,
        chain: Chain,
        candidates: list[Candidate],
        prompt: Sequence[int],
        root: str,
        pin: str,
    ) -> tuple[Chain, list[Candidate]]:
        """The chain, its last block or two swapped for the siblings that restore the most
        of the prompt. The blocks matching the most tokens may be another conversation's,
        which went on past this one's point of departure and kept no sliding-window
        positions before it, where a sibling matching a few tokens less (this
        conversation's own last turn, ending in a partial block) holds them."""
        blocks = self._pinner.agent_blocks(chain)
        best = self._pinner.usable(blocks, prompt)
        if blocks is None or best >= reusable_prefix(
            common_prefix(blocks.token_ids, prompt), len(prompt)
        ):
            return chain, candidates
        try:
            for cut in range(len(chain) - 1, max(-1, len(chain) - 3), -1):
                chain, candidates, best = await self._try_siblings(
                    chain, candidates, prompt, cut, root=root, pin=pin, best=best
                )
        except BaseException:  # the caller went away: nobody else will release the pins
            self._pool.release_owner(pin)
            raise
        return chain, candidates

    async def _try_siblings(
        self,
        chain: Chain,
        candidates: list[Candidate],
        prompt: Sequence[int],
        cut: int,
        *,
        root: str,
        pin: str,
        best: int,
    ) -> tuple[Chain, list[Candidate], int]:
        """Block ``cut``'s siblings tried in its place: the chain that restores the most,
        with the pins of the blocks it does not keep let go."""
        size = self._walk.block_tokens
        parent = candidates[cut - 1].key if cut else root
        siblings = await self._walk.children_by_match(parent, tuple(prompt[cut * size :]))
        for other in (c for c in siblings if c.key != candidates[cut].key):
            fetched = await asyncio.to_thread(self._pinner.fetch, other, cut, pin)
            if not isinstance(fetched, HotBlock):
                continue
            trial = [*chain[:cut], (fetched, other.hot is None)]
            usable = self._pinner.usable(self._pinner.agent_blocks(trial), prompt)
            dropped = chain[cut:] if usable > best else trial[cut:]
            self._pool.release(pin, [i for b, _ in dropped for i in b.pool_ids()])
            if usable > best:
                chain, candidates, best = trial, [*candidates[:cut], other], usable
        return chain, candidates, best
