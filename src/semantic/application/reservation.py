"""One request's claim on the block pool, grown as its cache grows."""

from __future__ import annotations

from semantic.domain.block_pool import BlockPool
from semantic.domain.blocks import KVBlock
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.errors import PoolExhaustedError
from semantic.ports.model_backend import ExportedKV


class BlockReservation:
    """Blocks a request holds for the positions its cache holds, layer by layer.

    ``grow_to(n)`` claims what ``n`` positions need (a sliding layer never more than its
    window reaches) all at once or not at all; ``bind`` turns the final KV into blocks on the
    claimed ids, so extraction allocates nothing new; ``release`` gives everything back.
    """

    def __init__(self, pool: BlockPool, spec: ModelCacheSpec, owner: str) -> None:
        self._pool = pool
        self._spec = spec
        self.owner = owner
        self._ids: list[list[int]] = [[] for _ in range(spec.n_layers)]
        self.positions = 0

    @property
    def block_count(self) -> int:
        return sum(len(ids) for ids in self._ids)

    def shortfall(self, n_positions: int) -> int:
        """Blocks still to claim for ``n_positions`` (0 if already covered)."""
        return sum(
            max(0, self._spec.blocks_for_layer(layer, n_positions) - len(ids))
            for layer, ids in enumerate(self._ids)
        )

    def grow_to(self, n_positions: int) -> bool:
        """Claim blocks for ``n_positions``; False (nothing claimed) if the pool is short."""
        if n_positions <= self.positions:
            return True
        if not self._pool.can_allocate(self.shortfall(n_positions)):
            return False
        try:
            for layer, ids in enumerate(self._ids):
                target = self._spec.blocks_for_layer(layer, n_positions)
                if target > len(ids):
                    ids.extend(self._pool.allocate(self.owner, layer, target - len(ids)))
                elif target < len(ids):  # a sliding window moved past its oldest block
                    surplus = len(ids) - target
                    self._pool.release(self.owner, ids[:surplus])
                    del ids[:surplus]
        except PoolExhaustedError:  # another thread took blocks between check and claim
            return False
        self.positions = n_positions
        return True

    def bind(self, exported: ExportedKV) -> tuple[tuple[KVBlock, ...], ...]:
        """Wrap exported payloads as blocks on claimed ids; give back the ids left over."""
        layers: list[tuple[KVBlock, ...]] = []
        for layer, exported_payloads in enumerate(exported.layers):
            ids = self._ids[layer]
            payloads = exported_payloads
            if len(payloads) > len(ids):  # a sliding layer's history: kept if there is room
                ids.extend(self._claim(layer, len(payloads) - len(ids)))
                payloads = payloads[len(payloads) - len(ids) :]  # else its oldest blocks go
            layers.append(
                tuple(
                    KVBlock(pool_id, layer, p.index, p.n_tokens, p.data, p.start)
                    for pool_id, p in zip(ids, payloads, strict=False)
                )
            )
            surplus = ids[len(payloads) :]
            if surplus:
                self._pool.release(self.owner, surplus)
            del ids[len(payloads) :]
        self.positions = exported.n_tokens
        return tuple(layers)

    def _claim(self, layer: int, n: int) -> list[int]:
        """``n`` more blocks of ``layer``, or none if the pool is short of them."""
        try:
            return self._pool.allocate(self.owner, layer, n)
        except PoolExhaustedError:
            return []

    def release(self) -> None:
        self._pool.release(self.owner, [b for ids in self._ids for b in ids])
        self._ids = [[] for _ in range(self._spec.n_layers)]
        self.positions = 0
