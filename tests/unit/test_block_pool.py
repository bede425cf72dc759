from __future__ import annotations

import threading

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from semantic.domain.block_pool import BlockPool
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.errors import BlockOwnershipError, PoolExhaustedError

OWNERS = st.sampled_from(["a", "b", "c", "cache"])


class PoolMachine(RuleBasedStateMachine):
    """Any sequence of operations keeps the pool's books balanced."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(12)
        self.model: dict[int, set[str]] = {}

    @rule(owner=OWNERS, layer=st.integers(0, 3), n=st.integers(0, 6))
    def allocate(self, owner: str, layer: int, n: int) -> None:
        free = self.pool.free_count
        if n > free:
            with pytest.raises(PoolExhaustedError) as raised:
                self.pool.allocate(owner, layer, n)
            assert raised.value.requested == n
            assert raised.value.free == free
            return
        ids = self.pool.allocate(owner, layer, n)
        assert len(set(ids)) == n
        for block_id in ids:
            assert block_id not in self.model, "a block was handed out twice"
            self.model[block_id] = {owner}

    @precondition(lambda self: bool(self.model))
    @rule(owner=OWNERS, data=st.data())
    def share(self, owner: str, data: st.DataObject) -> None:
        block_id = data.draw(st.sampled_from(sorted(self.model)))
        if owner in self.model[block_id]:
            with pytest.raises(BlockOwnershipError):
                self.pool.share(owner, [block_id])
            return
        self.pool.share(owner, [block_id])
        self.model[block_id].add(owner)

    @precondition(lambda self: bool(self.model))
    @rule(owner=OWNERS, data=st.data())
    def release(self, owner: str, data: st.DataObject) -> None:
        block_id = data.draw(st.sampled_from(sorted(self.model)))
        if owner not in self.model[block_id]:
            with pytest.raises(BlockOwnershipError):
                self.pool.release(owner, [block_id])
            return
        freed = self.pool.release(owner, [block_id])
        self.model[block_id].discard(owner)
        if self.model[block_id]:
            assert freed == [], "a shared block was freed before its last reference"
        else:
            assert freed == [block_id]
            del self.model[block_id]

    @rule(owner=OWNERS)
    def release_owner(self, owner: str) -> None:
        self.pool.release_owner(owner)
        for block_id in list(self.model):
            self.model[block_id].discard(owner)
            if not self.model[block_id]:
                del self.model[block_id]

    @invariant()
    def books_balance(self) -> None:
        usage = self.pool.usage()
        assert usage.free + usage.used == usage.capacity
        assert usage.used == len(self.model)
        for block_id, holders in self.model.items():
            assert self.pool.ref_count(block_id) == len(holders)
        self.pool.check_integrity()


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_exhaustion_says_what_was_asked_and_what_is_free() -> None:
    pool = BlockPool(3)
    pool.allocate("a", 0, 2)
    with pytest.raises(PoolExhaustedError, match="asked for 2 blocks, 1 free of 3"):
        pool.allocate("b", 0, 2)
    assert pool.free_count == 1


def test_a_block_of_every_layer_comes_whole_or_not_at_all() -> None:
    pool = BlockPool(4)
    with pytest.raises(PoolExhaustedError, match="asked for 5 blocks, 4 free of 4"):
        pool.allocate_layers("cache", [0, 1, 2, 3, 4])
    assert pool.free_count == 4
    assert pool.owners() == frozenset()
    ids = pool.allocate_layers("cache", [2, 0, 1])
    assert [pool.layer_of(i) for i in ids] == [2, 0, 1]
    assert pool.held_by("cache") == frozenset(ids)
    pool.check_integrity()


def test_capacity_comes_from_the_byte_budget() -> None:
    spec = ModelCacheSpec(30, 3, 64, 64, "float32", (None,) * 30)
    assert spec.block_bytes == 393_216
    assert BlockPool.from_budget(spec, 10 * spec.block_bytes + 5).capacity == 10


def test_transfer_moves_holds_without_freeing() -> None:
    pool = BlockPool(4)
    ids = pool.allocate("request", 0, 2)
    pool.transfer("request", "cache", ids)
    assert pool.held_by("request") == frozenset()
    assert pool.held_by("cache") == frozenset(ids)
    assert pool.used_count == 2


def test_concurrent_allocate_and_release_keep_the_books() -> None:
    pool = BlockPool(64)

    def churn(owner: str) -> None:
        for _ in range(500):
            try:
                ids = pool.allocate(owner, 0, 3)
            except PoolExhaustedError:
                continue
            pool.release(owner, ids)

    threads = [threading.Thread(target=churn, args=(f"t{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    pool.check_integrity()
    assert pool.used_count == 0
