"""What a finished request leaves: its blocks kept in memory and queued for saving.

Runs on the engine thread as each request completes, so it does no I/O: the blocks move
from the request to the cache's pool owner, join the hot index (a block already there is
kept and the duplicate freed), and one save job goes to the writer (``Saver``), fenced by
the lease the agent's turn holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from semantic.application.cache.hot_index import CACHE_OWNER, HotBlock, HotIndex
from semantic.application.cache.lineage import ANONYMOUS_AGENT
from semantic.application.cache.persistence import SaveJob, Saver
from semantic.application.cache.retention_book import RetentionBook
from semantic.application.engine.events import CompletionEvent
from semantic.domain.block_identity import chain_keys
from semantic.domain.block_pool import BlockPool
from semantic.domain.blocks import AgentBlocks, KVBlock
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.generation import FinishReason
from semantic.ports.leases import Lease

LeaseOf = Callable[[str, str], Lease | None]
"""The lease an agent's turn holds on this instance (``AgentLeases.held``), if any; called
on the engine thread (a dict read)."""


class Adoption:
    """``AgentCacheStore.adopt``: a finished request's blocks into the hot tier."""

    def __init__(
        self,
        pool: BlockPool,
        spec: ModelCacheSpec,
        hot: HotIndex,
        saver: Saver,
        *,
        root: Callable[[str], str],
        lease_of: LeaseOf | None,
        retention: RetentionBook,
    ) -> None:
        self._pool = pool
        self._spec = spec
        self._hot = hot
        self._saver = saver
        self._root = root
        self._lease_of = lease_of
        self._retention = retention
        """The lease an agent's turn holds (``AgentLeases.held``): its save is fenced by it."""

    def adopt(self, event: CompletionEvent, agent_id: str) -> None:
        """Keep a finished request's blocks (engine thread; no I/O) and queue their save."""
        blocks = event.blocks
        unfinished = event.finish_reason in (FinishReason.CANCELLED, FinishReason.ERROR)
        if blocks is None or unfinished or not self._saver.running:
            self._pool.release_owner(event.request_id)  # a cancelled request leaves no trace
            return
        chain = self._keep(event, blocks)
        self._hot.retain(chain, self._retention.hint(event.namespace, agent_id))
        self._pool.release_owner(event.request_id)
        anonymous = agent_id == ANONYMOUS_AGENT
        held = self._lease_of  # read now, while the turn that ran it still holds it
        lease = None if anonymous or held is None else held(event.namespace, agent_id)
        self._saver.submit(
            SaveJob(
                event.request_id,
                event.namespace,
                agent_id,
                anonymous,
                chain,
                len(blocks.token_ids),
                lease,
            )
        )

    def _keep(self, event: CompletionEvent, blocks: AgentBlocks) -> list[HotBlock]:
        """The request's blocks moved to the cache's owner, one hot block per block of tokens
        (a block the index already holds is kept, this copy freed)."""
        size = self._spec.block_tokens
        tokens = blocks.token_ids
        parent = self._root(event.namespace)
        chain: list[HotBlock] = []
        for index, key in enumerate(chain_keys(parent, tokens, size, include_partial=True)):
            layers = tuple(_block_at(layer_blocks, index) for layer_blocks in blocks.layers)
            block = HotBlock(
                key,
                parent,
                index,
                tokens[index * size : (index + 1) * size],
                layers,
                namespace=event.namespace,
            )
            self._pool.transfer(event.request_id, CACHE_OWNER, block.pool_ids())
            kept = self._hot.add(block)
            if kept is not block:
                self._pool.release(CACHE_OWNER, block.pool_ids())
            chain.append(kept)
            parent = key
        return chain


def _block_at(layer_blocks: Sequence[KVBlock], index: int) -> KVBlock | None:
    for block in layer_blocks:
        if block.index == index:
            return block
    return None
