"""AgentCacheStore: find the longest stored prefix of a prompt, and keep what requests leave.

Lookups walk the prompt's block ids (memory first, then disk), then reuse the stored block
that shares the longest token prefix with the rest, even if it ends mid-block. Completed
requests hand their blocks over on the engine thread (no I/O there); a single writer task
saves new blocks to disk and commits the metadata after the files are durable.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from semantic.application.active_request import StoredPrefix
from semantic.application.cache.disk_room import DISK_FLOOR_BYTES, DiskRoom, DiskState
from semantic.application.cache.hot_index import CACHE_OWNER, HotBlock, HotIndex
from semantic.application.cache.lineage import ANONYMOUS_AGENT
from semantic.application.cache.loader import BlockLoader, LoadOutcome
from semantic.application.cache.persistence import SaveJob, Saver
from semantic.application.cache.read_lanes import LaneReaders, in_order, read_lanes, when_all_done
from semantic.application.cache.shared_tier import SharedTier
from semantic.application.cache.stats import CacheStats, Restored
from semantic.application.events import CompletionEvent
from semantic.domain.block_identity import chain_keys, chain_root
from semantic.domain.block_pool import BlockPool
from semantic.domain.blocks import AgentBlocks, KVBlock, restorable_prefix
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.generation import FinishReason
from semantic.domain.tokens import common_prefix, reusable_prefix
from semantic.ports.block_store import BlockStore
from semantic.ports.leases import Lease
from semantic.ports.metadata_store import BlockRecord, MetadataStore
from semantic.ports.shared_blocks import SharedBlocks

log = logging.getLogger(__name__)

T = TypeVar("T")

LeaseOf = Callable[[str, str], Lease | None]
"""The lease an agent's turn holds on this instance (``AgentLeases.held``), if any; called
on the engine thread (a dict read)."""

Fetched = HotBlock | LoadOutcome
"""A block pinned in memory, or why it could not be."""


OTHER_TAILS = 3
"""Siblings, beyond the best match, that a prompt may try in place of a block of its chain
when the chain cannot restore its prefix (``AgentCacheStore._restorable_tail``): siblings
are many where conversations share a long system prompt, and each one tried may be a read
from disk."""


@dataclass(frozen=True)
class CachedPrefix:
    """What a prompt can restore. ``blocks`` are pinned under ``pin`` until released;
    ``stored`` pins the whole stored prefix again later (None when nothing is stored)."""

    blocks: AgentBlocks | None
    pin: str
    hot_tokens: int
    disk_tokens: int
    matched_tokens: int
    stored: StoredPrefix | None = None


@dataclass(frozen=True)
class CacheConfig:
    disk_quota_bytes: int | None = None
    disk_reserve_bytes: int = 0
    """Free space to keep on the data directory's disk: blocks are dropped, least recently
    used first, when less is left."""
    disk_floor_bytes: int = DISK_FLOOR_BYTES
    """Free space below which no block file is written, and a transcript write takes even
    its own agent's blocks: the database's room (``disk_room``)."""


@dataclass
class _Candidate:
    key: str
    hot: HotBlock | None = None
    record: BlockRecord | None = None
    tokens: tuple[int, ...] = field(default_factory=tuple)


class AgentCacheStore:
    def __init__(
        self,
        pool: BlockPool,
        spec: ModelCacheSpec,
        fingerprint: str,
        *,
        block_store: BlockStore,
        metadata: MetadataStore,
        config: CacheConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        lease_of: LeaseOf | None = None,
        shared: SharedBlocks | None = None,
    ) -> None:
        self._pool = pool
        self._spec = spec
        self._fingerprint = fingerprint
        self._metadata = metadata
        self.stats = CacheStats()
        self.hot = HotIndex(pool, clock)
        self._shared = (
            None
            if shared is None
            else SharedTier(shared, block_store, metadata, self.stats, fingerprint)
        )
        self._loader = BlockLoader(
            pool,
            spec,
            block_store,
            metadata=metadata,
            hot=self.hot,
            stats=self.stats,
            shared=self._shared,
        )
        config = config or CacheConfig()
        self._room = DiskRoom(
            block_store,
            metadata,
            self.hot,
            self.stats,
            quota=config.disk_quota_bytes,
            reserve=config.disk_reserve_bytes,
            floor=config.disk_floor_bytes,
        )
        self._saver = Saver(
            block_store, metadata, self.hot, self.stats, room=self._room, shared=self._shared
        )
        self._lease_of = lease_of
        """The lease an agent's turn holds (``AgentLeases.held``): its save is fenced by it."""
        self._pins = itertools.count(1)
        self._readers = LaneReaders()

    async def start(self) -> None:
        """Clean up after a crash, then start the writer (and the shared tier's pusher)."""
        await self._saver.start()
        if self._shared is not None:
            await self._shared.start()

    async def close(self) -> None:
        """Flush every pending save, then stop the writer."""
        await self._saver.close()
        if self._shared is not None:
            await self._shared.close()
        self._readers.shutdown()

    async def flush(self) -> None:
        await self._saver.flush()

    async def flush_shared(self) -> None:
        """Wait until every committed block queued for the shared tier has been tried."""
        await self.flush()
        if self._shared is not None:
            await self._shared.flush()

    @property
    def shared_state(self) -> str | None:
        """The shared block tier: ``ok``, ``unreachable``, or None when there is none."""
        return None if self._shared is None else self._shared.state

    @property
    def disk(self) -> DiskState:
        """Free space on the data directory's disk, and whether writes are being refused."""
        return self._room.state

    def check_room(self) -> None:
        """Raises ``DiskFullError`` while the disk is as full as when a write was last
        refused: a turn that could not be kept is refused before its reply is computed."""
        self._room.check()

    async def keeping(self, namespace: str, agent_id: str, write: Callable[[], Awaitable[T]]) -> T:
        """A metadata write with room made for it on the disk, cached KV giving way first
        (``DiskRoom.keeping``); raises ``DiskFullError`` when nothing of ours is left."""
        return await self._room.keeping(namespace, agent_id, write)

    @property
    def fingerprint(self) -> str:
        """The model fingerprint block keys are rooted in (ADR 0005)."""
        return self._fingerprint

    def root(self, namespace: str) -> str:
        return chain_root(self._fingerprint, namespace)

    async def prepare(self, namespace: str, prompt: Sequence[int]) -> CachedPrefix:
        """Pin the longest stored prefix of ``prompt`` (loading disk blocks into memory)."""
        pin = f"pin-{next(self._pins)}"
        self.stats.queried_tokens += len(prompt)
        candidates = await self._walk(namespace, prompt)
        lanes = read_lanes(len(candidates))
        fetches = [
            self._readers.submit(index, self._fetch_lane, candidates, lane, pin)
            for index, lane in enumerate(lanes)
        ]
        fetched = asyncio.wrap_future(when_all_done(fetches))
        try:
            await asyncio.shield(fetched)
            outcomes = in_order(lanes, [f.result() for f in fetches])
            chain, corrupt = self._chain(candidates, outcomes, pin)
        except BaseException:  # the caller went away, or a read failed: unpin what it pinned
            fetched.add_done_callback(self._unpin_when_fetched(pin, fetches))
            raise
        if corrupt is not None:
            try:
                await self._loader.quarantine(corrupt)
            except Exception as error:  # noqa: BLE001 - the request recomputes from there anyway
                log.warning("could not quarantine block %s: %s", corrupt[:16], error)
            except BaseException:  # the caller went away meanwhile: nobody will release it
                self._pool.release_owner(pin)
                raise
        if len(chain) == len(candidates):
            chain, candidates = await self._restorable_tail(
                chain, candidates, prompt, self.root(namespace), pin
            )
        hot_tokens, disk_tokens = _by_tier(chain)
        blocks = self._agent_blocks([block for block, _ in chain])
        matched = self._usable(blocks, prompt)
        counted = _restored(chain, matched, len(prompt))
        self.stats.count_restore(counted)
        good = list(itertools.takewhile(lambda c: c.key != corrupt, candidates))
        stored = self._stored(good, prompt, asyncio.get_running_loop(), counted)
        return CachedPrefix(blocks, pin, hot_tokens, disk_tokens, matched, stored)

    def _stored(
        self,
        candidates: list[_Candidate],
        prompt: Sequence[int],
        loop: asyncio.AbstractEventLoop,
        counted: Restored,
    ) -> StoredPrefix | None:
        """How to pin this prefix again from the engine thread, once the pool has room for
        it. Keeps keys and disk records only: holding the hot blocks themselves would keep
        their memory alive after the pool evicted them."""
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
        plan: list[_Candidate],
        loop: asyncio.AbstractEventLoop,
        prompt: tuple[int, ...],
        counted: list[Restored],
        owner: str,
    ) -> AgentBlocks | None:
        """The blocks still hot are pinned first, so reading the others (which may evict
        idle blocks to make room) cannot evict them. ``counted``: what the request's
        restores have counted in the metrics so far (a cell: pinned again, updated)."""
        taken = [self.hot.take(c.key, owner) for c in plan]
        outcomes: list[Fetched] = []
        for index, (candidate, hot) in enumerate(zip(plan, taken, strict=True)):
            if hot is not None or (outcomes and not isinstance(outcomes[-1], HotBlock)):
                outcomes.append(hot or LoadOutcome.GONE)  # past a failure: released below
            elif candidate.record is None:
                outcomes.append(LoadOutcome.GONE)
            else:
                outcomes.append(self._loader.load(candidate.record, index, owner))
        chain, corrupt = self._chain(plan, outcomes, owner)
        if corrupt is not None:
            quarantined = asyncio.run_coroutine_threadsafe(self._loader.quarantine(corrupt), loop)
            quarantined.add_done_callback(_log_failure)
        blocks = self._agent_blocks([block for block, _ in chain])
        matched = self._usable(blocks, prompt)
        restored = _restored(chain, matched, len(prompt))
        self.stats.count_restore(restored, counted[0])  # the request's restores so far
        counted[0] = counted[0].at_least(restored)
        return blocks

    def _blocks_to_read(self, plan: list[_Candidate]) -> int:
        """Pool blocks pinning ``plan`` again would read from disk; looking the others up
        marks them recently used, so making room evicts other blocks first."""
        return sum(self._spec.n_layers for c in plan if self.hot.get(c.key) is None)

    def _chain(
        self, candidates: list[_Candidate], outcomes: list[Fetched], pin: str
    ) -> tuple[list[tuple[HotBlock, bool]], str | None]:
        """The leading run of candidates that were pinned or loaded, with whether each came
        from disk; blocks after the first failure are unpinned. Also returns the key of a
        block that failed verification, if one did."""
        chain: list[tuple[HotBlock, bool]] = []
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

    def _fetch_lane(self, candidates: list[_Candidate], lane: range, pin: str) -> list[Fetched]:
        """A lane stops at its first block that could not be pinned: the prefix ends there
        (``_chain``), and loading the blocks after it would only evict other agents' idle
        blocks to make room for blocks dropped at once."""
        out: list[Fetched] = []
        for index in lane:
            if out and not isinstance(out[-1], HotBlock):
                out.append(LoadOutcome.GONE)
            else:
                out.append(self._fetch(candidates[index], index, pin))
        return out

    def _fetch(self, candidate: _Candidate, index: int, pin: str) -> Fetched:
        taken = self.hot.take(candidate.key, pin)
        if taken is not None:
            return taken
        if candidate.record is None:
            return LoadOutcome.GONE
        return self._loader.load(candidate.record, index, pin)

    def release(self, prefix: CachedPrefix) -> None:
        self._pool.release_owner(prefix.pin)

    def adopt_completion(self, event: CompletionEvent) -> None:
        """``adopt`` under the agent the completion names (the engine loop's
        ``on_completion``)."""
        self.adopt(event, event.agent_id)

    def adopt(self, event: CompletionEvent, agent_id: str) -> None:
        """Keep a finished request's blocks (engine thread; no I/O) and queue their save."""
        blocks = event.blocks
        unfinished = event.finish_reason in (FinishReason.CANCELLED, FinishReason.ERROR)
        if blocks is None or unfinished or not self._saver.running:
            self._pool.release_owner(event.request_id)  # a cancelled request leaves no trace
            return
        size = self._spec.block_tokens
        tokens = blocks.token_ids
        parent = self.root(event.namespace)
        chain: list[HotBlock] = []
        for index, key in enumerate(chain_keys(parent, tokens, size, include_partial=True)):
            layers = tuple(_block_at(layer_blocks, index) for layer_blocks in blocks.layers)
            block = HotBlock(key, parent, index, tokens[index * size : (index + 1) * size], layers)
            self._pool.transfer(event.request_id, CACHE_OWNER, block.pool_ids())
            kept = self.hot.add(block)
            if kept is not block:
                self._pool.release(CACHE_OWNER, block.pool_ids())
            chain.append(kept)
            parent = key
        self._pool.release_owner(event.request_id)
        anonymous = agent_id == ANONYMOUS_AGENT
        held = self._lease_of  # read now, while the turn that ran it still holds it
        lease = None if anonymous or held is None else held(event.namespace, agent_id)
        self._saver.submit(
            SaveJob(
                event.request_id, event.namespace, agent_id, anonymous, chain, len(tokens), lease
            )
        )

    async def saved(self, request_id: str) -> None:
        """Wait until what ``request_id`` left behind is on disk (returns at once if nothing
        was saved for it)."""
        await self._saver.saved(request_id)

    def reclaim(self, n_pool_blocks: int) -> int:
        """Memory pressure: evict idle hot blocks that are safe on disk."""
        return self.hot.evict(n_pool_blocks)

    async def forget(self, keys: Sequence[str]) -> None:
        """Drop deleted blocks from memory and disk."""
        self.hot.remove(keys)
        await self._saver.delete_files(keys)
        if self._shared is not None:
            self._shared.discard(keys)

    async def _restorable_tail(
        self,
        chain: list[tuple[HotBlock, bool]],
        candidates: list[_Candidate],
        prompt: Sequence[int],
        root: str,
        pin: str,
    ) -> tuple[list[tuple[HotBlock, bool]], list[_Candidate]]:
        """The chain, its last block or two swapped for the siblings that restore the most
        of the prompt. The blocks matching the most tokens may be another conversation's,
        which went on past this one's point of departure and kept no sliding-window
        positions before it, where a sibling matching a few tokens less (this
        conversation's own last turn, ending in a partial block) holds them."""
        blocks = self._agent_blocks([block for block, _ in chain])
        best = self._usable(blocks, prompt)
        if blocks is None or best >= reusable_prefix(
            common_prefix(blocks.token_ids, prompt), len(prompt)
        ):
            return chain, candidates
        size = self._spec.block_tokens
        try:
            for cut in range(len(chain) - 1, max(-1, len(chain) - 3), -1):
                parent = candidates[cut - 1].key if cut else root
                siblings = await self._children_by_match(parent, tuple(prompt[cut * size :]))
                for other in (c for c in siblings if c.key != candidates[cut].key):
                    fetched = await asyncio.to_thread(self._fetch, other, cut, pin)
                    if not isinstance(fetched, HotBlock):
                        continue
                    trial = [*chain[:cut], (fetched, other.hot is None)]
                    usable = self._usable(self._agent_blocks([b for b, _ in trial]), prompt)
                    dropped = chain[cut:] if usable > best else trial[cut:]
                    self._pool.release(pin, [i for b, _ in dropped for i in b.pool_ids()])
                    if usable > best:
                        chain, candidates, best = trial, [*candidates[:cut], other], usable
        except BaseException:  # the caller went away: nobody else will release the pins
            self._pool.release_owner(pin)
            raise
        return chain, candidates

    async def _walk(self, namespace: str, prompt: Sequence[int]) -> list[_Candidate]:
        size = self._spec.block_tokens
        root = self.root(namespace)
        keys = chain_keys(root, prompt, size)
        records = await self._metadata.blocks(keys)  # hot ones too: they may be evicted
        # before a request that waits pins them again, and then come back from disk
        records = await self._shared_records(namespace, keys, records)
        out: list[_Candidate] = []
        parent = root
        for index, key in enumerate(keys):
            want = tuple(prompt[index * size : (index + 1) * size])
            hot = self.hot.get(key)
            record = records.get(key)
            if record is not None and record.quarantined:
                record = None
            if hot is not None and hot.tokens == want:
                out.append(_Candidate(key, hot=hot, record=record, tokens=want))
            elif record is not None and record.tokens == want:
                out.append(_Candidate(key, record=record, tokens=want))
            else:
                break
            parent = key
        rest = tuple(prompt[len(out) * size :])
        tails = await self._children_by_match(parent, rest) if rest else []
        return out + tails[:1]

    async def _shared_records(
        self, namespace: str, keys: list[str], records: dict[str, BlockRecord]
    ) -> dict[str, BlockRecord]:
        """Past the blocks this instance knows, those the shared tier holds: a prompt
        another instance answered (its metadata is not this one's) restores from there."""
        if self._shared is None:
            return records
        unknown = next(
            (i for i, k in enumerate(keys) if k not in records and self.hot.get(k) is None),
            len(keys),
        )
        if unknown == len(keys):
            return records
        return {**await self._shared.records(namespace, keys[unknown:]), **records}

    async def _children_by_match(self, parent: str, rest: tuple[int, ...]) -> list[_Candidate]:
        stored = {r.key: r for r in await self._metadata.children(parent) if not r.quarantined}
        hot = self.hot.children(parent)
        options = [
            _Candidate(h.key, hot=h, record=stored.pop(h.key, None), tokens=h.tokens) for h in hot
        ]
        options += [_Candidate(r.key, record=r, tokens=r.tokens) for r in stored.values()]
        ranked = sorted(
            ((common_prefix(c.tokens, rest), c.hot is not None, c) for c in options),
            key=lambda ranking: ranking[:2],
            reverse=True,
        )
        return [c for shared, _, c in ranked[: 1 + OTHER_TAILS] if shared > 0]

    def _usable(self, blocks: AgentBlocks | None, prompt: Sequence[int]) -> int:
        """The prompt's tokens ``blocks`` match, cut to the prefix they can restore
        (``restorable_prefix``), which is all the engine restores."""
        if blocks is None:
            return 0
        matched = common_prefix(blocks.token_ids, prompt)
        reusable = reusable_prefix(matched, len(prompt))
        usable = restorable_prefix(blocks, reusable, self._spec)
        return matched if usable == reusable else usable

    def _agent_blocks(self, chain: list[HotBlock]) -> AgentBlocks | None:
        if not chain:
            return None
        tokens = tuple(itertools.chain.from_iterable(block.tokens for block in chain))
        layers: list[tuple[KVBlock, ...]] = []
        for layer in range(self._spec.n_layers):
            held = (block.layers[layer] for block in chain)
            layers.append(tuple(b for b in held if b is not None))
        return AgentBlocks("", tokens, tuple(layers))


def _by_tier(chain: list[tuple[HotBlock, bool]]) -> tuple[int, int]:
    """Tokens of a pinned chain that were hot, and that came from disk."""
    hot = sum(len(b.tokens) for b, from_disk in chain if not from_disk)
    return hot, sum(len(b.tokens) for b, _ in chain) - hot


def _restored(chain: list[tuple[HotBlock, bool]], matched: int, prompt_tokens: int) -> Restored:
    """The matched tokens of a pinned chain, shared between the tiers its blocks came from."""
    hot, disk = _by_tier(chain)
    share = matched / max(1, hot + disk)
    hit = reusable_prefix(matched, prompt_tokens)
    return Restored(hit, round(hot * share), round(disk * share))


def _block_at(layer_blocks: Sequence[KVBlock], index: int) -> KVBlock | None:
    for block in layer_blocks:
        if block.index == index:
            return block
    return None


def _log_failure(future: Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("quarantining a block failed: %s", future.exception())
