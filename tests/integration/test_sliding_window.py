"""Sliding-window layers (Gemma 3 shape) on a tiny random model built here, no download."""

from __future__ import annotations

import random

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import gemma3_text

from semantic.adapters.mlx.backend import MlxBackend
from semantic.adapters.mlx.cpu import accelerator_for
from semantic.adapters.mlx.kv.kv_blocks import gather_cache, spec_from_model
from semantic.adapters.mlx.kv.kv_payloads import MlxKV
from semantic.application.engine.batch_engine import BlockPoolBatchEngine, EngineConfig
from semantic.domain.block_pool import BlockPool
from semantic.domain.blocks import AgentBlocks, KVBlock
from tests.helpers import generate
from tests.unit.fakes import ByteTokenizer

WINDOW = 300


@pytest.fixture(scope="module")
def tiny_gemma() -> gemma3_text.Model:
    mx.random.seed(3)
    args = gemma3_text.ModelArgs(
        model_type="gemma3_text",
        hidden_size=64,
        num_hidden_layers=4,
        intermediate_size=128,
        num_attention_heads=2,
        head_dim=32,
        num_key_value_heads=1,
        vocab_size=256,
        sliding_window=WINDOW,
        sliding_window_pattern=2,
        query_pre_attn_scalar=32,
    )
    model = gemma3_text.Model(args)
    mx.eval(model.parameters())
    return model


def make_engine(model: gemma3_text.Model) -> BlockPoolBatchEngine:
    spec = spec_from_model(model)
    backend = MlxBackend(model, spec, "tiny-gemma", frozenset(), accelerator=accelerator_for(model))
    tokenizer = ByteTokenizer([bytes([i]) for i in range(256)])
    return BlockPoolBatchEngine(backend, tokenizer, BlockPool(400), EngineConfig())


def test_the_spec_knows_which_layers_slide(tiny_gemma: gemma3_text.Model) -> None:
    assert spec_from_model(tiny_gemma).layer_windows == (WINDOW, None, WINDOW, None)


def test_sliding_layers_keep_only_the_blocks_their_window_reaches(
    tiny_gemma: gemma3_text.Model,
) -> None:
    engine = make_engine(tiny_gemma)
    rng = random.Random(5)
    done = generate(engine, [rng.randrange(256) for _ in range(900)], 6)
    assert done.blocks is not None
    n = done.blocks.n_tokens
    sliding, global_ = done.blocks.layers[0], done.blocks.layers[1]
    assert len(global_) == -(-n // 256)
    assert len(sliding) <= -(-WINDOW // 256) + 1
    first = sliding[0]
    assert first.index * 256 + first.start <= n - WINDOW
    engine.release_blocks(done.request_id)
    assert engine.pool.used_count == 0


def test_restoring_sliding_window_blocks_continues_like_a_cold_prefill(
    tiny_gemma: gemma3_text.Model,
) -> None:
    engine = make_engine(tiny_gemma)
    rng = random.Random(11)
    first = generate(engine, [rng.randrange(256) for _ in range(700)], 4)
    assert first.blocks is not None
    follow_up = [*first.blocks.token_ids, *(rng.randrange(256) for _ in range(60))]
    warm = generate(engine, follow_up, 8, cached_blocks=first.blocks)
    cold = generate(engine, follow_up, 8)
    assert warm.stats.cached_tokens == first.blocks.n_tokens
    assert warm.token_ids == cold.token_ids


def tiny_gemma_with(window: int) -> gemma3_text.Model:
    mx.random.seed(7)
    args = gemma3_text.ModelArgs(
        model_type="gemma3_text",
        hidden_size=32,
        num_hidden_layers=4,
        intermediate_size=64,
        num_attention_heads=2,
        head_dim=16,
        num_key_value_heads=1,
        vocab_size=256,
        sliding_window=window,
        sliding_window_pattern=2,
        query_pre_attn_scalar=16,
    )
    model = gemma3_text.Model(args)
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize(("window", "prompt_tokens"), [(32, 100), (64, 600), (300, 600)])
def test_a_next_turn_that_leaves_the_stored_reply_early_continues_like_a_cold_run(
    window: int, prompt_tokens: int
) -> None:
    """Issue 36: a next turn sharing less than the whole stored turn (a reply tokenized
    otherwise when sent back) needed sliding positions the blocks had let go, and failed
    with "layer 0 is missing positions". Each layer's window before the reply is kept now,
    so it continues from wherever it leaves the reply, or a little before it."""
    engine = make_engine(tiny_gemma_with(window))
    rng = random.Random(window)
    first = generate(engine, [rng.randrange(256) for _ in range(prompt_tokens)], 12)
    assert first.blocks is not None
    stored = first.blocks
    for shared in (stored.n_tokens, stored.n_tokens - 7, prompt_tokens, prompt_tokens - 5):
        follow_up = [*stored.token_ids[:shared], *(rng.randrange(256) for _ in range(20))]
        warm = generate(engine, follow_up, 6, cached_blocks=stored)
        cold = generate(engine, follow_up, 6)
        assert warm.error is None
        assert warm.token_ids == cold.token_ids, shared
        assert (warm.stats.cached_tokens, warm.stats.dropped_tokens) == (shared, 0)
        for done in (warm, cold):
            engine.release_blocks(done.request_id)
    engine.release_blocks(first.request_id)
    assert engine.pool.used_count == 0


def test_a_next_turn_past_what_the_window_kept_is_computed_not_failed() -> None:
    """A reply longer than the window leaves the history and the cache apart: a turn that
    leaves that reply early finds no whole window, and is computed from the start."""
    engine = make_engine(tiny_gemma_with(32))
    rng = random.Random(2)
    first = generate(engine, [rng.randrange(256) for _ in range(100)], 60)
    assert first.blocks is not None
    follow_up = [*first.blocks.token_ids[:130], 1, 2, 3]
    warm = generate(engine, follow_up, 6, cached_blocks=first.blocks)
    assert warm.error is None
    assert warm.token_ids == generate(engine, follow_up, 6).token_ids
    assert (warm.stats.cached_tokens, warm.stats.dropped_tokens) == (0, 130)


def test_a_cache_gathered_from_one_block_owns_its_memory(tiny_gemma: gemma3_text.Model) -> None:
    """A restored block's memory is reused once the block is dropped (restore_buffers), so
    a cache built from it must be a copy even where a concatenation of one piece would hand
    back the piece itself (a sliding layer within one block, no room)."""
    spec = spec_from_model(tiny_gemma)
    n = 200
    shape = (1, spec.n_kv_heads, n, spec.k_head_dim)
    payloads = [MlxKV(mx.random.normal(shape), mx.random.normal(shape)) for _ in range(4)]
    mx.eval([(p.keys, p.values) for p in payloads])
    layers = tuple((KVBlock(layer, layer, 0, n, payloads[layer]),) for layer in range(4))
    blocks = AgentBlocks("", tuple(range(n)), layers)
    caches = gather_cache(tiny_gemma, blocks, n, 0, spec)
    before = [np.array(c.keys) for c in caches]
    for payload in payloads:  # the buffer is overwritten by the next restore
        np.asarray(payload.keys)[...] = 0.0
    after = [np.array(c.keys)[..., :n, :] for c in caches]
    for old, new in zip(before, after, strict=True):
        np.testing.assert_array_equal(old[..., :n, :], new)
