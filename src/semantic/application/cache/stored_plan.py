"""A prefix found on the asyncio side, pinned again later from the engine thread.

A request pins its restored prefix from arrival to admission; when the pool is short the
engine lets waiting requests' pins go (``StoredPrefix``). This module builds what pins the
prefix again at admission: it keeps the keys and disk records of the blocks the lookup
found, not the hot blocks themselves (holding those would keep their memory alive after
the pool evicted them).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from semantic.application.cache.chain import Candidate, ChainPinner, Fetched, restored
from semantic.application.cache.hot_index import HotBlock, HotIndex
from semantic.application.cache.loader import BlockLoader, LoadOutcome
from semantic.application.cache.stats import CacheStats, Restored
from semantic.application.engine.active_request import StoredPrefix
from semantic.domain.blocks import AgentBlocks
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.tokens import common_prefix

log = logging.getLogger(__name__)


class StoredPlan:
    """Builds a ``StoredPrefix`` from a lookup's candidates."""

    def __init__(
        self,
        spec: ModelCacheSpec,
        hot: HotIndex,
        loader: BlockLoader,
        pinner: ChainPinner,
        stats: CacheStats,
    ) -> None:
        self._spec = spec
        self._hot = hot
        self._loader = loader
        self._pinner = pinner
        self._stats = stats

    def stored(
        self,
        candidates: list[Candidate],
        prompt: Sequence[int],
        loop: asyncio.AbstractEventLoop,
        counted: Restored,
    ) -> StoredPrefix | None:
        """How to pin this prefix again from the engine thread, once the pool has room for
        it (None when nothing is stored). ``counted``: what the lookup counted in the
        metrics, so pinning again counts only what it adds."""
        if not candidates:
            return None
        plan = [replace(c, hot=None) for c in candidates]
        stored = tuple(itertools.chain.from_iterable(c.tokens for c in plan))
        return StoredPrefix(
            common_prefix(stored, prompt),
            functools.partial(self._pin_plan, plan, loop, tuple(prompt), [counted]),
            functools.partial(self._blocks_to_read, plan),
        )

    def _pin_plan(
        self,
        plan: list[Candidate],
        loop: asyncio.AbstractEventLoop,
        prompt: tuple[int, ...],
        counted: list[Restored],
        owner: str,
    ) -> AgentBlocks | None:
        """The blocks still hot are pinned first, so reading the others (which may evict
        idle blocks to make room) cannot evict them. ``counted``: what the request's
        restores have counted in the metrics so far (a cell: pinned again, updated)."""
        taken = [self._hot.take(c.key, owner) for c in plan]
        outcomes: list[Fetched] = []
        for index, (candidate, hot) in enumerate(zip(plan, taken, strict=True)):
            if hot is not None or (outcomes and not isinstance(outcomes[-1], HotBlock)):
                outcomes.append(hot or LoadOutcome.GONE)  # past a failure: released below
            elif candidate.record is None:
                outcomes.append(LoadOutcome.GONE)
            else:
                outcomes.append(self._loader.load(candidate.record, index, owner))
        chain, corrupt = self._pinner.chain(plan, outcomes, owner)
        if corrupt is not None:
            quarantined = asyncio.run_coroutine_threadsafe(self._loader.quarantine(corrupt), loop)
            quarantined.add_done_callback(_log_failure)
        blocks = self._pinner.agent_blocks(chain)
        matched = self._pinner.usable(blocks, prompt)
        now = restored(chain, matched, len(prompt))
        self._stats.count_restore(now, counted[0])  # the request's restores so far
        counted[0] = counted[0].at_least(now)
        return blocks

    def _blocks_to_read(self, plan: list[Candidate]) -> int:
        """Pool blocks pinning ``plan`` again would read from disk; looking the others up
        marks them recently used, so making room evicts other blocks first."""
        return sum(self._spec.n_layers for c in plan if self._hot.get(c.key) is None)


def _log_failure(future: Future[Any]) -> None:
    """A quarantine nobody waits for: its failure is logged, or nobody would see it."""
    if not future.cancelled() and future.exception() is not None:
        log.warning("quarantining a block failed: %s", future.exception())
