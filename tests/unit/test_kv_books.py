"""The KV books balance after every operation, over random sequences of them.

A state machine drives ``KVBooks`` as the engine and the cache do: requests arrive (some
pinning a prefix the cache holds), grow, finish (their KV bound to their blocks and
adopted by the cache), are cancelled, copy their prefix, let pins go to make room for the
head, pin a stored prefix again; the cache evicts. After each step the pool's books
balance (free + held == capacity, nothing both free and held), every request's ledger is
exactly what the pool holds under its name, a pin is held exactly while the request says
so, and no block is held by anyone the books do not know. A block freed twice raises in
the pool itself. At the end, with everything let go, every block is free again.
"""

from __future__ import annotations

import itertools

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from semantic.application.books.kv_books import KVBooks
from semantic.application.engine.active_request import (
    ActiveRequest,
    GenerationRequest,
    HeldPrefix,
    StoredPrefix,
)
from semantic.application.engine.completion import CompletionDetector
from semantic.domain.block_pool import BlockPool
from semantic.domain.blocks import AgentBlocks
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.generation import GREEDY, CompletionCriteria
from semantic.ports.model_backend import BlockPayload, ExportedKV
from tests.unit.fakes import EOS, FakeTokenizer

SPEC = ModelCacheSpec(2, 1, 2, 2, "float32", (None, 8), block_tokens=4)  # one sliding layer
CAPACITY = 48
HOT = "hot"


def exported(n_tokens: int, history: bool) -> ExportedKV:
    """What closing a sequence of ``n_tokens`` gives; ``history``: a sliding layer also
    exports blocks its window has passed."""
    layers = []
    for layer in range(SPEC.n_layers):
        first = SPEC.first_block_needed(layer, n_tokens)
        if history:
            first = 0
        last = (n_tokens - 1) // SPEC.block_tokens
        layers.append(
            [
                BlockPayload(i, 0, min(SPEC.block_tokens, n_tokens - i * SPEC.block_tokens), None)
                for i in range(first, last + 1)
            ]
        )
    return ExportedKV(n_tokens, layers)


class BooksMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.pool = BlockPool(CAPACITY)
        self.books = KVBooks(self.pool, SPEC, reclaim=self.reclaim, clock=lambda: self.now)
        self.waiting: list[ActiveRequest] = []
        self.running: list[ActiveRequest] = []
        self.hot: list[AgentBlocks] = []
        self.ids = itertools.count(1)

    def reclaim(self, n: int) -> int:
        """The cache evicts its oldest KV until ``n`` blocks came free (or it has none)."""
        freed = 0
        while self.hot and freed < n:
            freed += len(self.pool.release(HOT, self.hot.pop(0).pool_ids()))
        return freed

    def stored(self) -> StoredPrefix | None:
        if not self.hot:
            return None
        kept = self.hot[-1]

        def pin(owner: str) -> AgentBlocks | None:
            if kept not in self.hot:
                return None
            self.pool.share(owner, kept.pool_ids())
            return kept

        return StoredPrefix(len(kept.token_ids), pin)

    @rule(length=st.integers(1, 16), max_tokens=st.integers(1, 12), pin=st.booleans())
    def arrive(self, length: int, max_tokens: int, pin: bool) -> None:
        request_id = f"req-{next(self.ids)}"
        prefix = self.hot[0] if pin and self.hot else None
        prompt = (*prefix.token_ids, *range(100, 100 + length)) if prefix else tuple(range(length))
        criteria = CompletionCriteria(max_tokens=max_tokens)
        held = HeldPrefix.of(prefix, prompt) if prefix is not None else None
        request = GenerationRequest("a", prompt, criteria, GREEDY, held, stored=self.stored())
        detector = CompletionDetector(FakeTokenizer(), criteria, frozenset({EOS}))
        active = ActiveRequest(request_id, request, detector, self.books.ledger(request_id), 0.0)
        if held is not None:
            self.books.pin(active, held)
        self.waiting.append(active)

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def admit(self, data: st.DataObject) -> None:
        """Admit from the head while requests fit, as a round does; with nothing running,
        the head may make room."""
        while self.waiting:
            head = self.waiting[0]
            self.books.pin_again(head)
            fits = self.books.grow(head.reservation, len(head.prompt))
            if not fits and not (not self.running and self.books.make_room(head, self.waiting)):
                break
            self.running.append(self.waiting.pop(0))
        for active in self.running:  # caches that have copied their prefix let it go
            if data.draw(st.booleans()):
                self.books.copied(active)
        self.now += data.draw(st.sampled_from([0.0, 0.5, 2.0]))

    @precondition(lambda self: self.running)
    @rule(data=st.data(), more=st.integers(1, 12))
    def grow(self, data: st.DataObject, more: int) -> None:
        active = data.draw(st.sampled_from(self.running))
        self.books.grow(active.reservation, active.reservation.positions + more)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), history=st.booleans(), adopt=st.booleans())
    def finish(self, data: st.DataObject, history: bool, adopt: bool) -> None:
        active = data.draw(st.sampled_from(self.running))
        self.running.remove(active)
        if active.pinned:
            self.books.release_pin(active)
        ledger = active.reservation
        if ledger.positions == 0:
            self.books.release(ledger)
            return
        layers = self.books.bind(ledger, exported(ledger.positions, history))
        blocks = AgentBlocks("a", active.prompt[: ledger.positions], layers)
        if adopt and blocks.pool_ids():  # the cache keeps it, then the engine lets go
            self.pool.share(HOT, blocks.pool_ids())
            self.hot.append(blocks)
        self.books.release_completion(active.id)

    @precondition(lambda self: self.waiting or self.running)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        active = data.draw(st.sampled_from(self.waiting + self.running))
        for table in (self.waiting, self.running):
            if active in table:
                table.remove(active)
        if active.pinned:
            self.books.release_pin(active)
        self.books.release(active.reservation)

    @rule(n=st.integers(0, 8))
    def fits(self, n: int) -> None:
        assert self.books.fits(n) == (n <= self.pool.free_count)

    @rule()
    def evict(self) -> None:
        self.reclaim(1)

    @invariant()
    def books_balance(self) -> None:
        self.pool.check_integrity()
        held = set().union(*(self.pool.held_by(o) for o in self.pool.owners()))
        assert self.pool.free_count + len(held) == CAPACITY

    @invariant()
    def every_hold_is_known(self) -> None:
        live = self.waiting + self.running
        known = {HOT} | {a.id for a in live} | {a.pin_owner for a in live}
        assert self.pool.owners() <= known
        for active in live:
            ids = {b for layer in active.reservation.ids for b in layer}
            assert ids == set(self.pool.held_by(active.id))
            assert active.pinned == bool(self.pool.held_by(active.pin_owner))

    def teardown(self) -> None:
        for active in self.waiting + self.running:
            if active.pinned:
                self.books.release_pin(active)
            self.books.release(active.reservation)
        self.reclaim(CAPACITY + 1)
        assert self.pool.free_count == CAPACITY  # nothing leaked
        self.pool.check_integrity()


BooksMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None, derandomize=True
)
test_kv_books = BooksMachine.TestCase


def test_a_global_ledger_grown_a_position_at_a_time_holds_exactly_what_it_needs() -> None:
    """Within a block, a step claims nothing (and skips the walk over the layers); across a
    boundary, every layer gets its next block."""
    spec = ModelCacheSpec(3, 1, 2, 2, "float32", (None,) * 3, block_tokens=4)
    pool = BlockPool(12)
    books = KVBooks(pool, spec, reclaim=None, clock=lambda: 0.0)
    ledger = books.ledger("r")
    for n in range(1, 17):
        assert books.grow(ledger, n)
        assert [len(ids) for ids in ledger.ids] == [spec.blocks_for_layer(0, n)] * 3
        assert len(pool.held_by("r")) == spec.blocks_for_tokens(n) == ledger.block_count
    assert not books.grow(ledger, 17)  # a fifth block a layer: the pool holds four
    assert ledger.positions == 16
