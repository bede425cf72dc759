"""The host pass (native/llama_pass.c) on the real model, against mlx-lm's own forward."""

from __future__ import annotations

import gc
import weakref
from dataclasses import replace
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import BatchKVCache, KVCache

from semantic.adapters.mlx.accelerator import Group
from semantic.adapters.mlx.cpu.host_pass import HostPass
from semantic.adapters.mlx.cpu.llama_native import HOST_PASS_ENV
from semantic.adapters.mlx.kv.kv_blocks import gather_cache
from semantic.adapters.mlx.kv.kv_payloads import MlxKV, StackedKV
from semantic.adapters.mlx.kv.restored_prefix import RestoredPrefix
from semantic.domain.blocks import AgentBlocks, KVBlock
from tests.helpers import generate, kv_of_both, tiny_family
from tests.integration.conftest import EngineFactory, RealModel

TOLERANCE = 5e-4
"""Relative to the largest hidden value: the two differ in rounding only (RoPE, norms)."""


@pytest.fixture(scope="module")
def host(real_model: RealModel) -> HostPass:
    made = HostPass.of(real_model.loaded.model)
    if made is None:
        pytest.skip("no host pass on this machine (no AVX-512 kernels or no compiler)")
    return made


def tokens(seed: int, count: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(100, 40_000, count)]


def fresh_caches(model: Any) -> list[Any]:
    return [KVCache() for _ in model.model.layers]  # type: ignore[no-untyped-call]  # mlx-lm


def close(ours: mx.array, theirs: mx.array) -> bool:
    a, b = np.asarray(ours), np.asarray(theirs)
    return bool(np.abs(a - b).max() <= TOLERANCE * np.abs(b).max())


def test_a_prompt_continued_on_the_host_matches_mlx(real_model: RealModel, host: HostPass) -> None:
    """300 tokens prefilled by MLX, then 20 on each path, then one decode step."""
    model = real_model.loaded.model
    prefix, new = mx.array([tokens(1, 300)]), mx.array([tokens(2, 20)])
    theirs, ours = fresh_caches(model), fresh_caches(model)
    for caches in (theirs, ours):
        model.model(prefix, cache=caches)
    for step in (new, mx.array([[42]])):
        expected = model.model(step, cache=theirs)
        got = host.hidden([Group(step, ours)])
        assert got is not None
        assert close(got[0], expected)
    assert [c.offset for c in ours] == [c.offset for c in theirs] == [321] * len(ours)
    assert close(ours[7].keys[..., :321, :], theirs[7].keys[..., :321, :])
    assert close(ours[7].values[..., :321, :], theirs[7].values[..., :321, :])


def test_left_padded_batches_match_mlx_on_every_real_row(
    real_model: RealModel, host: HostPass
) -> None:
    model = real_model.loaded.model
    padding = [3, 0, 7]
    batch = mx.array([[0] * pad + tokens(pad, 10 - pad) for pad in padding])
    theirs = [BatchKVCache(padding) for _ in model.model.layers]
    ours = [BatchKVCache(padding) for _ in model.model.layers]
    expected = model.model(batch, cache=theirs)
    got = host.hidden([Group(batch, ours)])
    assert got is not None
    for row, pad in enumerate(padding):
        assert close(got[0][row, pad:], expected[row, pad:])
    step = mx.array([[5], [6], [7]])
    expected, got = model.model(step, cache=theirs), host.hidden([Group(step, ours)])
    assert got is not None
    assert close(got[0], expected)
    assert ours[0]._idx == theirs[0]._idx == 11  # noqa: SLF001 - the batch cache's write index
    assert ours[0].offset.tolist() == theirs[0].offset.tolist() == [8, 11, 4]


def test_a_batch_moves_once_a_step_on_the_host_and_in_mlx_lm_after_it(
    real_model: RealModel, host: HostPass
) -> None:
    """The pass gives a batch's layers one offsets array a step; mlx-lm's own step after
    it must move each layer's once, which holds while it replaces the array (an addition
    in place would move the shared one once a layer)."""
    model = real_model.loaded.model
    padding = [2, 0]
    caches = [BatchKVCache(padding) for _ in model.model.layers]
    prompt = mx.array([[0] * pad + tokens(pad + 3, 6 - pad) for pad in padding])
    for batch in (prompt, mx.array([[5], [6]])):
        assert host.hidden([Group(batch, caches)]) is not None
    assert [c.offset.tolist() for c in caches] == [[5, 7]] * len(caches)
    model.model(mx.array([[7], [8]]), cache=caches)
    assert [c.offset.tolist() for c in caches] == [[6, 8]] * len(caches)


def test_a_batch_whose_buffers_grow_ahead_gives_the_bits_of_growing_when_full(
    real_model: RealModel, host: HostPass
) -> None:
    """The next buffers are made a layer a step while the old ones are still written; the
    positions written meanwhile must reach them before the switch."""
    model = real_model.loaded.model
    at_once = HostPass.of(model, grow_lead=0)
    assert at_once is not None
    padding = [0, 5]
    prompt = mx.array([[0] * pad + tokens(pad + 7, 200 - pad) for pad in padding])
    ahead_caches = [BatchKVCache(padding) for _ in model.model.layers]
    full_caches = [BatchKVCache(padding) for _ in model.model.layers]
    model.model(prompt, cache=ahead_caches)
    model.model(prompt, cache=full_caches)
    widths = []
    for step in range(80):  # 200 -> 280 positions: past the first buffers' 256
        token = mx.array([[100 + step], [200 + step]])
        ahead = host.hidden([Group(token, ahead_caches)])
        full = at_once.hidden([Group(token, full_caches)])
        assert ahead is not None
        assert full is not None
        assert np.array_equal(np.asarray(ahead[0]), np.asarray(full[0])), step
        widths.append(np.asarray(ahead_caches[0].keys).shape[2])
    assert widths[0] == 256
    assert widths[-1] == 512
    assert widths.index(512) < 55, "switched before the old buffers were full"
    for ours, theirs in zip(ahead_caches, full_caches, strict=True):
        ours_written, theirs_written = (np.asarray(c.keys)[..., :280, :] for c in (ours, theirs))
        assert np.array_equal(ours_written, theirs_written)


def test_a_row_gets_the_same_bits_alone_and_beside_others(
    real_model: RealModel, host: HostPass
) -> None:
    """Batch invariance: a decode row and a prompt chunk computed in one pass or apart."""
    model = real_model.loaded.model
    prompts = [mx.array([tokens(3, 40)]), mx.array([tokens(4, 70)])]
    apart, together = [fresh_caches(model) for _ in prompts], [fresh_caches(model) for _ in prompts]
    for prompt, a, b in zip(prompts, apart, together, strict=True):
        model.model(prompt, cache=a)
        model.model(prompt, cache=b)
    groups = [mx.array([[11]]), mx.array([tokens(5, 25)])]
    alone = [host.hidden([Group(g, c)]) for g, c in zip(groups, apart, strict=True)]
    beside = host.hidden([Group(g, c) for g, c in zip(groups, together, strict=True)])
    assert beside is not None
    for single, shared in zip(alone, beside, strict=True):
        assert single is not None
        assert np.array_equal(np.asarray(single[0]), np.asarray(shared))
    assert np.array_equal(np.asarray(apart[1][3].keys), np.asarray(together[1][3].keys))


def test_a_remembered_layout_follows_new_buffers_and_keeps_no_old_one_alive(
    real_model: RealModel, host: HostPass
) -> None:
    """Steps reuse the buffers' layout while the caches hold the same arrays; caches given
    other arrays (a copy) are described again and continue with the same bits; and the
    layout holds the arrays it saw only weakly."""
    model = real_model.loaded.model
    caches = fresh_caches(model)
    assert host.hidden([Group(mx.array([tokens(3, 20)]), caches)]) is not None
    first = weakref.ref(caches[0].keys)
    assert host.hidden([Group(mx.array([[42]]), caches)]) is not None
    assert caches[0].keys is first()  # room left: the same buffers, written in place
    copies = fresh_caches(model)
    for cache, copy in zip(caches, copies, strict=True):
        copy.keys, copy.values, copy.offset = cache.keys + 0, cache.values + 0, cache.offset
    mx.eval([(c.keys, c.values) for c in copies])
    step = mx.array([[7]])
    ours, theirs = host.hidden([Group(step, caches)]), host.hidden([Group(step, copies)])
    assert ours is not None
    assert theirs is not None
    assert np.array_equal(np.asarray(ours[0]), np.asarray(theirs[0]))
    assert mx.array_equal(caches[29].keys[..., :22, :], copies[29].keys[..., :22, :]).item()
    del caches
    gc.collect()
    assert first() is None


def test_a_pass_of_more_than_32_rows_is_left_to_mlx(real_model: RealModel, host: HostPass) -> None:
    caches = fresh_caches(real_model.loaded.model)
    assert host.hidden([Group(mx.array([tokens(6, 33)]), caches)]) is None
    assert all(c.offset == 0 and c.keys is None for c in caches)


def test_a_view_without_room_gets_a_buffer_of_its_own(
    real_model: RealModel, host: HostPass
) -> None:
    """A cache whose arrays are views ending at their last position (as a row cut from a
    batch could be) must be copied before the pass writes: never past the view's end into
    memory another array owns."""
    model = real_model.loaded.model
    owners = fresh_caches(model)
    model.model(mx.array([tokens(7, 12)]), cache=owners)
    mx.eval([(c.keys, c.values) for c in owners])
    before = np.array(np.asarray(owners[0].keys))
    views = fresh_caches(model)
    for view, owner in zip(views, owners, strict=True):
        view.keys, view.values = owner.keys[..., :12, :], owner.values[..., :12, :]
        view.offset = 12
    assert np.shares_memory(np.asarray(views[0].keys), np.asarray(owners[0].keys))
    assert host.hidden([Group(mx.array([[9, 10]]), views)]) is not None
    assert np.array_equal(np.asarray(owners[0].keys), before)
    assert not np.shares_memory(np.asarray(views[0].keys), np.asarray(owners[0].keys))
    assert views[0].offset == 14


def test_the_host_pass_can_be_turned_off(
    real_model: RealModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(HOST_PASS_ENV, "0")
    assert HostPass.of(real_model.loaded.model) is None


def as_read_from_disk(blocks: AgentBlocks) -> AgentBlocks:
    """The same blocks laid out as a restore leaves them: each block index's layers stacked
    in one buffer (``StackedKV``), keys and values alternating."""
    layers: list[list[KVBlock]] = [[] for _ in blocks.layers]
    for index in range(len(blocks.layers[0])):
        column = [layer_blocks[index] for layer_blocks in blocks.layers]
        tensors = []
        for block in column:
            assert isinstance(block.payload, MlxKV)
            tensors += [np.asarray(block.payload.keys)[0], np.asarray(block.payload.values)[0]]
        stack = np.ascontiguousarray(np.stack(tensors))
        buffer = mx.array(stack.view(np.uint8).reshape(-1))
        for layer, block in enumerate(column):
            payload = StackedKV(buffer, mx.float32, stack.shape, 2 * layer, 2 * layer + 1)
            layers[layer].append(replace(block, payload=payload))
    return replace(blocks, layers=tuple(tuple(b) for b in layers))


@pytest.mark.parametrize(("from_disk", "n_new"), [(False, 20), (True, 20), (True, 70)])
def test_a_prefix_read_in_place_gives_the_bits_of_a_built_cache(
    real_model: RealModel,
    host: HostPass,
    make_engine: EngineFactory,
    from_disk: bool,
    n_new: int,
) -> None:
    """The restored blocks read where they lie (hot: the pool's arrays; warm: the buffers
    files were read into) and the same blocks copied into one cache first: same hidden
    states, same new KV, and the cache built afterwards holds both, bit for bit. 70 new
    tokens take three passes, each reading the prefix and the passes' rows before it."""
    model, spec = real_model.loaded.model, real_model.spec
    engine, _ = make_engine()
    blocks = generate(engine, tokens(9, 600), 2).blocks
    assert blocks is not None
    if from_disk:
        blocks = as_read_from_disk(blocks)
    n = blocks.n_tokens
    prefix = RestoredPrefix.of(blocks, n, spec)
    assert prefix is not None
    suffix = mx.array([tokens(10, n_new)])
    tails = fresh_caches(model)
    in_place = host.hidden([Group(suffix, tails, prefix)])
    built = gather_cache(model, blocks, n, n_new, spec)
    expected = [host.hidden([Group(suffix[:, at : at + 32], built)]) for at in range(0, n_new, 32)]
    assert in_place is not None
    assert all(part is not None for part in expected)
    whole = np.concatenate([np.asarray(part[0]) for part in expected if part is not None], 1)
    assert np.array_equal(np.asarray(in_place[0]), whole)
    after = gather_cache(model, blocks, n, 0, spec, tails=tails)
    end = n + n_new
    for layer in (0, 17, 29):
        assert after[layer].offset == built[layer].offset == end
        for ours, theirs in (
            (after[layer].keys, built[layer].keys),
            (after[layer].values, built[layer].values),
        ):
            assert np.array_equal(np.asarray(ours)[..., :end, :], np.asarray(theirs)[..., :end, :])


@pytest.mark.parametrize("n_new", [20, 50])
def test_a_returning_agent_read_in_place_continues_as_with_its_cache_built_first(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch, n_new: int
) -> None:
    """Through the engine: a short new message over restored blocks (read in place, the
    cache built at the next decode step) gives the tokens and the KV it gives when the
    cache is built before the first pass. 50 new tokens take two host passes in place,
    and one pass on MLX once the cache is built: the same tokens, the KV within rounding."""
    engine, _ = make_engine()
    earlier = tokens(11, 500)
    first = generate(engine, earlier, 4)
    assert first.blocks is not None
    turn = [*first.blocks.token_ids, *tokens(12, n_new)]
    made: list[RestoredPrefix | None] = []
    real_of = RestoredPrefix.of

    def spying(blocks: AgentBlocks, n_tokens: int, spec: Any) -> RestoredPrefix | None:
        made.append(real_of(blocks, n_tokens, spec))
        return made[-1]

    monkeypatch.setattr(RestoredPrefix, "of", spying)
    in_place = generate(engine, turn, 12, cached_blocks=first.blocks)
    assert made
    assert made[-1] is not None
    monkeypatch.setattr(RestoredPrefix, "of", lambda *_: None)
    built_first = generate(engine, turn, 12, cached_blocks=first.blocks)
    assert (
        in_place.stats.cached_tokens
        == built_first.stats.cached_tokens
        == len(first.blocks.token_ids)
    )
    assert in_place.token_ids == built_first.token_ids
    for ours, theirs in kv_of_both(in_place, built_first):
        assert mx.array_equal(ours, theirs).item() if n_new <= 32 else close(ours, theirs)


@pytest.mark.parametrize("family", ["mistral", "llama3", "qwen2", "qwen3"])
def test_each_llama_bodied_family_gets_the_host_pass(family: str) -> None:
    """Mistral is mlx-lm's llama class with ``model_type`` "mistral"; Llama 3 scales its
    RoPE frequencies, Qwen2 adds biases to q/k/v, Qwen3 RMS-norms each head's queries and
    keys: the same C pass reads each, and continues a prompt, a chunk then a decode step,
    as mlx-lm's own forward does, its new keys and values too."""
    from semantic.adapters.mlx.cpu.attention import install

    model = tiny_family(family, seed=4)
    assert install(model)
    host = HostPass.of(model)
    if host is None:
        pytest.skip("no host pass on this machine (no AVX-512 kernels or no compiler)")
    prefix, new = mx.array([tokens(5, 40)]) % 512, mx.array([tokens(6, 7)]) % 512
    theirs, ours = fresh_caches(model), fresh_caches(model)
    for caches in (theirs, ours):
        model.model(prefix, cache=caches)
    for step in (new, mx.array([[42]])):
        expected = model.model(step, cache=theirs)
        got = host.hidden([Group(step, ours)])
        assert got is not None
        assert close(got[0], expected)
    for cache, reference in zip(ours, theirs, strict=True):
        assert cache.offset == reference.offset == 48
        assert close(cache.keys[..., :48, :], reference.keys[..., :48, :])
        assert close(cache.values[..., :48, :], reference.values[..., :48, :])
