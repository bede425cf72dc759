"""Bring a block from disk into memory: verified, accounted in the pool, indexed hot."""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import Enum

from semantic.application.cache.hot_index import CACHE_OWNER, HotBlock, HotIndex
from semantic.application.cache.shared_tier import SharedTier
from semantic.application.cache.stats import CacheStats
from semantic.domain.block_pool import BlockPool
from semantic.domain.blocks import KVBlock
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.errors import CacheCorruptionError, PoolExhaustedError
from semantic.ports.block_store import BlockStore, LayerPayload
from semantic.ports.metadata_store import BlockRecord, BlockRecords

log = logging.getLogger(__name__)


class LoadOutcome(Enum):
    CORRUPT = "corrupt"
    NO_ROOM = "no room"
    GONE = "gone"


class BlockLoader:
    def __init__(
        self,
        pool: BlockPool,
        spec: ModelCacheSpec,
        store: BlockStore,
        *,
        block_records: BlockRecords,
        hot: HotIndex,
        stats: CacheStats,
        shared: SharedTier | None = None,
        reclaim: Callable[[int], int] | None = None,
    ) -> None:
        """``reclaim``: frees pool blocks when the pool is full (``AgentCacheStore.reclaim``:
        namespaces over their memory quota first); else ``hot.evict``."""
        self._pool = pool
        self._reclaim = reclaim or hot.evict
        self._shared = shared
        self._spec = spec
        self._store = store
        self._block_records = block_records
        self._hot = hot
        self._stats = stats

    def load(self, record: BlockRecord, index: int, pin: str) -> HotBlock | LoadOutcome:
        """Read, verify and index one block (blocking: call from a worker thread)."""
        already = self._hot.take(record.key, pin)
        if already is not None:
            return already
        try:
            payloads = self._payloads(record)
        except CacheCorruptionError as error:
            log.warning("block %s failed verification: %s", record.key[:16], error)
            return LoadOutcome.CORRUPT
        if payloads is None:
            return LoadOutcome.GONE
        layers: list[KVBlock | None] = [None] * self._spec.n_layers
        size = len(record.tokens)
        for payload in payloads:
            if not 0 <= payload.layer < self._spec.n_layers or payload.n_tokens != size:
                log.warning("block %s holds the wrong shape; treating it as corrupt", record.key)
                return LoadOutcome.CORRUPT
        claimed = self._claim([p.layer for p in payloads])
        if claimed is None:
            return LoadOutcome.NO_ROOM
        for pool_id, payload in zip(claimed, payloads, strict=True):
            layers[payload.layer] = KVBlock(
                pool_id, payload.layer, index, payload.n_tokens, payload.data, payload.start
            )
        block = HotBlock(
            record.key,
            record.parent_key,
            index,
            record.tokens,
            tuple(layers),
            True,
            namespace=record.namespace,
        )
        kept = self._hot.add(block, pin)
        if kept is not block:
            self._pool.release(CACHE_OWNER, claimed)
        return kept

    def _payloads(self, record: BlockRecord) -> list[LayerPayload] | None:
        """With a shared tier, a block whose file this disk lacks (another instance wrote
        it) is read from the tier (the request's save then keeps it on this disk); not
        there either, it is a miss (None), never corruption: other instances may hold it.
        A file here that fails verification is replaced by the tier's copy where it has a
        good one, so its row (shared, in a cluster) is not quarantined. Without a tier, a
        missing file is read, and found corrupt, as before."""
        if self._shared is None:
            return self._store.load(record.key, record.checksum)
        if not self._store.has(record.key):
            return self._shared.fetch(record)
        try:
            return self._store.load(record.key, record.checksum)
        except CacheCorruptionError:
            payloads = self._shared.fetch(record)
            if payloads is None:
                raise  # quarantined as before: the row says nobody has a good copy
        log.warning("block %s failed verification; the shared tier's copy is used", record.key[:16])
        self._store.quarantine(record.key)  # this disk's copy; the request's save writes anew
        self._stats.corrupt_blocks += 1
        return payloads

    async def quarantine(self, key: str) -> None:
        """A block failed verification: move its file aside and stop using it, unless it was
        deleted meanwhile (then it was never corrupt, just gone)."""
        still = await self._block_records.blocks([key])
        if key not in still:
            return
        self._store.quarantine(key)
        await self._block_records.quarantine_block(key)
        self._stats.corrupt_blocks += 1
        log.warning("quarantined block %s; the request recomputes from there", key[:16])

    def _claim(self, layers: list[int]) -> list[int] | None:
        """One pool block per layer, evicting idle hot blocks if needed; None if no room."""
        for _ in range(2):
            try:
                return self._pool.allocate_layers(CACHE_OWNER, layers)
            except PoolExhaustedError:
                self._reclaim(len(layers))
        return None
