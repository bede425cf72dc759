"""Which queued requests take over the KV a finished request leaves (``PrefixSharing.heirs``)."""

from __future__ import annotations

from semantic.application.books.ledger import BlockLedger
from semantic.application.engine.active_request import ActiveRequest, GenerationRequest, HeldPrefix
from semantic.application.engine.completion import CompletionDetector
from semantic.application.engine.prefix_sharing import PrefixSharing
from semantic.domain.blocks import AgentBlocks, KVBlock
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.generation import GREEDY, CompletionCriteria
from tests.unit.fakes import EOS, FakeTokenizer

GLOBAL = ModelCacheSpec(1, 1, 2, 2, "float32", (None,), block_tokens=4)
SLIDING = ModelCacheSpec(2, 1, 2, 2, "float32", (None, 8), block_tokens=4)
LEADER = tuple(range(1, 21))  # five blocks


def request(
    prompt: tuple[int, ...], namespace: str = "A", cached: AgentBlocks | None = None
) -> ActiveRequest:
    criteria = CompletionCriteria(max_tokens=2)
    held = HeldPrefix.of(cached, prompt) if cached is not None else None
    generation = GenerationRequest("agent", prompt, criteria, GREEDY, held, namespace=namespace)
    detector = CompletionDetector(FakeTokenizer(), criteria, frozenset({EOS}))
    active = ActiveRequest(
        f"req-{len(prompt)}-{namespace}",
        generation,
        detector,
        BlockLedger("r", GLOBAL.n_layers),
        0.0,
    )
    active.pinned = cached is not None
    return active


def blocks(spec: ModelCacheSpec, first_sliding: int = 0) -> AgentBlocks:
    """The leader's KV; its sliding layer holds blocks from ``first_sliding`` on."""
    layers = []
    for layer in range(spec.n_layers):
        first = 0 if spec.window(layer) is None else first_sliding
        layers.append(tuple(KVBlock(i, layer, i, 4, None) for i in range(first, 5)))
    return AgentBlocks("leader", LEADER, tuple(layers))


def test_queued_requests_of_the_namespace_sharing_a_block_more_than_they_hold_inherit() -> None:
    leader = request(LEADER)
    shares = request((*LEADER[:12], 50, 51))
    other_tenant = request((*LEADER[:12], 50, 52), namespace="B")
    too_little = request((*LEADER[:3], 50, 51))
    holds_it = request((*LEADER[:9], 50), cached=blocks(GLOBAL))
    holds_less = request((*LEADER[:17], 50), cached=AgentBlocks("x", LEADER[:4], ((),)))
    queued = [shares, other_tenant, too_little, holds_it, holds_less]
    heirs = PrefixSharing(GLOBAL).heirs(leader, blocks(GLOBAL), queued)
    assert [heir for heir, _ in heirs] == [shares, holds_less]
    first = heirs[0][1]  # it pins the blocks it shares, not the leader's rest
    assert (first.token_ids, first.pool_ids()) == (LEADER[:12], [0, 1, 2])
    assert heirs[1][1].token_ids == LEADER  # 17 tokens: the fifth block too


def test_a_sliding_layer_that_dropped_the_blocks_a_prefix_reads_leaves_it_to_be_computed() -> None:
    leader = request(LEADER)
    late = request((*LEADER[:18], 50))  # its window reads positions 10..17
    early = request((*LEADER[:14], 50))  # 6..13
    sharing = PrefixSharing(SLIDING)
    heirs = sharing.heirs(leader, blocks(SLIDING, first_sliding=2), [late, early])
    assert [heir for heir, _ in heirs] == [late]
    heirs = sharing.heirs(leader, blocks(SLIDING, first_sliding=1), [late, early])
    assert [heir for heir, _ in heirs] == [late, early]
