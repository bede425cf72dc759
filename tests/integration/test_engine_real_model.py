"""The engine on the real embedded model: answers, exact restores, exact batching."""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from benchmarks.corpus import conversation

from semantic.adapters.mlx.cpu import layer_slice
from semantic.adapters.mlx.kv.kv_blocks import cut_into_blocks, gather_cache
from semantic.adapters.mlx.kv.kv_payloads import MlxKV, StackedKV, kv_arrays
from semantic.adapters.mlx.kv.restore_buffers import RestoreBuffers
from semantic.adapters.mlx.kv.restored_caches import RestoredCaches
from semantic.application.engine.events import CompletionEvent
from semantic.application.scheduler.pacer import PacerConfig
from semantic.domain.chat import ChatMessage
from semantic.domain.generation import FinishReason, SamplingParams
from semantic.ports.model_backend import PromptChunk, StepOutput
from tests.helpers import completions, generate, run_until_idle
from tests.integration.conftest import EngineFactory, RealModel

pytestmark = pytest.mark.model

QUESTION = [ChatMessage("user", "What is the capital of France?")]


def counter(real_model: RealModel) -> Callable[[Sequence[ChatMessage]], int]:
    return lambda messages: len(real_model.tokenizer.render_chat(messages))


def test_the_embedded_model_knows_the_capital_of_france(
    real_model: RealModel, make_engine: EngineFactory
) -> None:
    engine, _ = make_engine()
    done = generate(engine, real_model.tokenizer.render_chat(QUESTION), 24)
    assert "Paris" in done.text
    assert done.finish_reason is FinishReason.END_OF_TURN


def test_a_stop_string_is_cut_from_the_text_and_the_kept_tokens(
    real_model: RealModel, make_engine: EngineFactory
) -> None:
    engine, _ = make_engine()
    prompt = real_model.tokenizer.render_chat(QUESTION)
    done = generate(engine, prompt, 24, stop=["Paris"])
    assert done.finish_reason is FinishReason.STOP_STRING
    assert "Paris" not in done.text
    assert done.text.startswith("The capital of France is")
    assert done.blocks is not None
    kept_text = real_model.tokenizer.decode(done.token_ids)
    assert done.text.startswith(kept_text)  # " Paris" straddles the cut, so it is not kept
    assert done.blocks.n_tokens == len(prompt) + len(done.token_ids)


@pytest.mark.parametrize(("seed", "history"), [(1, 300), (2, 700)])
def test_restored_blocks_continue_exactly_as_a_cold_prefill(
    real_model: RealModel, make_engine: EngineFactory, seed: int, history: int
) -> None:
    tokenizer = real_model.tokenizer
    messages = conversation(seed, history, counter(real_model))
    earlier = tokenizer.render_chat(messages[:-2])
    full = tokenizer.render_chat(messages)
    engine, _ = make_engine()
    first = generate(engine, earlier, 4)
    assert first.blocks is not None
    warm = generate(engine, full, 32, cached_blocks=first.blocks)
    cold = generate(engine, full, 32)
    assert warm.stats.cached_tokens >= len(earlier) - 1
    assert cold.stats.cached_tokens == 0
    assert warm.token_ids == cold.token_ids


def test_blocks_to_cache_to_blocks_is_bit_exact(
    real_model: RealModel, make_engine: EngineFactory
) -> None:
    engine, _ = make_engine()
    prompt = real_model.tokenizer.render_chat(conversation(3, 600, counter(real_model)))
    blocks = generate(engine, prompt, 2).blocks
    assert blocks is not None
    assert len(blocks.layers[0]) == -(-blocks.n_tokens // 256)
    assert blocks.layers[0][-1].n_tokens == blocks.n_tokens % 256 or 256
    caches = gather_cache(real_model.loaded.model, blocks, blocks.n_tokens, 0, real_model.spec)
    again = cut_into_blocks(caches, blocks.n_tokens, real_model.spec)
    for layer, payloads in enumerate(again):
        assert len(payloads) == len(blocks.layers[layer])
        for block, payload in zip(blocks.layers[layer], payloads, strict=True):
            original, copy = block.payload, payload.data
            assert isinstance(original, MlxKV)
            assert isinstance(copy, MlxKV)
            assert original.keys.shape == copy.keys.shape
            assert mx.array_equal(original.keys, copy.keys).item()
            assert mx.array_equal(original.values, copy.values).item()


def test_blocks_cut_into_a_buffer_each_hold_the_same_kv_and_continue_alike(
    real_model: RealModel, make_engine: EngineFactory
) -> None:
    buffers = RestoreBuffers(max_bytes=1 << 30)
    engine, _ = make_engine(buffers=buffers)
    messages = conversation(5, 600, counter(real_model))
    earlier = real_model.tokenizer.render_chat(messages[:-2])
    full = real_model.tokenizer.render_chat(messages)
    first = generate(engine, earlier, 4)
    blocks = first.blocks
    assert blocks is not None
    assert all(isinstance(b.payload, StackedKV) for layer in blocks.layers for b in layer)
    caches = gather_cache(real_model.loaded.model, blocks, blocks.n_tokens, 0, real_model.spec)
    each = cut_into_blocks(caches, blocks.n_tokens, real_model.spec)  # an MLX array each
    for layer, payloads in enumerate(each):
        for block, payload in zip(blocks.layers[layer], payloads, strict=True):
            pairs = zip(kv_arrays(block.payload), kv_arrays(payload.data), strict=True)
            for stacked, alone in pairs:
                assert mx.array_equal(stacked, alone).item()
    warm = generate(engine, full, 16, cached_blocks=blocks)
    assert warm.stats.cached_tokens >= len(earlier) - 1
    assert warm.token_ids == generate(engine, full, 16).token_ids
    holder = first.request_id
    del first, blocks, caches, each, warm
    engine.release_blocks(holder)
    gc.collect()
    assert buffers.kept_bytes > 0, "the blocks' buffers went back to be reused"


def test_eight_agents_staggered_or_all_at_once_get_what_each_gets_alone(
    real_model: RealModel, make_engine: EngineFactory
) -> None:
    """All at once, their prompts are prefilled together in one left-padded pass."""
    tokenizer = real_model.tokenizer
    prompts = [
        tokenizer.render_chat([ChatMessage("user", f"Name a fruit that is {colour}.")])
        for colour in ("red", "yellow", "green", "orange", "purple", "blue", "brown", "pink")
    ]
    engine, _ = make_engine(pacer=PacerConfig(fixed_tokens=512))
    alone = [generate(engine, prompt, 10).token_ids for prompt in prompts]
    ids, events, most_decoding = [], [], 0
    for prompt in prompts:
        ids.append(engine.submit("agent", prompt, max_tokens=10))
        step = engine.step()
        events += step.events
        most_decoding = max(most_decoding, step.decoding)
    while engine.has_work():
        step = engine.step()
        events += step.events
        most_decoding = max(most_decoding, step.decoding)
    done = completions(events)
    assert most_decoding == 8
    assert [done[i].token_ids for i in ids] == alone
    together = [engine.submit("agent", prompt, max_tokens=10) for prompt in prompts]
    done = completions(run_until_idle(engine))
    assert [done[i].token_ids for i in together] == alone


def test_agents_sharing_a_long_system_prompt_at_once_get_what_each_gets_alone(
    real_model: RealModel, make_engine: EngineFactory
) -> None:
    """Admitted together, or while the first decodes, the others copy its prefix instead of
    computing it, and answer as they do alone."""
    tokenizer = real_model.tokenizer
    rules = " ".join(f"Rule {i}: answer in one short sentence." for i in range(45))
    prompts = [
        tokenizer.render_chat([ChatMessage("system", rules), ChatMessage("user", question)])
        for question in ("Name a fruit.", "Name a river.", "Name a bird.")
    ]
    engine, _ = make_engine()
    alone = [generate(engine, prompt, 8) for prompt in prompts]
    assert all(a.stats.cached_tokens == 0 for a in alone)
    together = [engine.submit("agent", prompt, max_tokens=8) for prompt in prompts]
    done = completions(run_until_idle(engine))
    assert [done[i].token_ids for i in together] == [a.token_ids for a in alone]
    shared = [done[i].stats.cached_tokens for i in together]
    assert shared[0] == 0
    assert min(shared[1:]) > 256
    leader = engine.submit("agent", prompts[0], max_tokens=8)
    while engine.step().decoding == 0:  # the leader's KV now lives in the decode batch
        pass
    late = engine.submit("agent", prompts[1], max_tokens=8)
    done = completions(run_until_idle(engine))
    assert done[late].token_ids == alone[1].token_ids
    assert done[late].stats.cached_tokens > 256
    assert done[leader].token_ids == alone[0].token_ids


def test_a_prefix_is_found_by_a_later_request_whatever_arrives_between(
    real_model: RealModel, make_engine: EngineFactory
) -> None:
    """Issue 32: r1 in namespace A, then another tenant's request, then r2 in A with r1's
    system prompt (more than a block: less is computed rather than shared). r2 waits
    behind the other's prefill until r1 has ended; it still restores at least 90% of its
    prompt from what r1 computed, and answers as it does alone."""
    tokenizer = real_model.tokenizer
    rules = " ".join(f"Rule {i}: answer in one short sentence." for i in range(30))
    first, second = (
        tokenizer.render_chat([ChatMessage("system", rules), ChatMessage("user", question)])
        for question in ("Name a fruit.", "Name a river.")
    )
    story = " ".join(f"Chapter {i} of a long story about a quiet town." for i in range(25))
    other = tokenizer.render_chat([ChatMessage("user", story)])
    engine, _ = make_engine()
    r1 = engine.submit("a1", first, max_tokens=2, namespace="A")
    events = engine.step().events  # r1 prefills, then decodes
    v = engine.submit("v", other, max_tokens=2, namespace="V")
    events += engine.step().events  # V is admitted; its prefill takes a few rounds
    assert not completions(events)
    r2 = engine.submit("a2", second, max_tokens=8, namespace="A")
    while engine.waiting:
        events += engine.step().events
    assert r1 in completions(events)  # no leader runs when r2 is admitted
    done = completions(events + run_until_idle(engine))
    assert done[v].stats.cached_tokens == 0
    assert done[r2].stats.cached_tokens >= 0.9 * len(second)
    assert done[r2].token_ids == generate(engine, second, 8).token_ids


def test_a_dry_pool_ends_a_request_gracefully_and_keeps_its_kv(
    real_model: RealModel, make_engine: EngineFactory
) -> None:
    spec = real_model.spec
    engine, _ = make_engine(budget_bytes=spec.n_layers * spec.block_bytes)  # 256 positions
    prompt = real_model.tokenizer.render_chat(conversation(4, 250, counter(real_model)))[:250]
    done = generate(engine, prompt, 40)
    assert done.finish_reason is FinishReason.POOL_EXHAUSTED
    assert done.blocks is not None
    assert done.blocks.n_tokens == 256
    engine.release_blocks(done.request_id)
    assert engine.pool.used_count == 0


def test_the_same_seed_samples_the_same_tokens(
    real_model: RealModel, make_engine: EngineFactory
) -> None:
    engine, _ = make_engine()
    prompt = real_model.tokenizer.render_chat([ChatMessage("user", "Tell me a story.")])
    sampling = SamplingParams(temperature=1.0, top_p=0.95, seed=1234)
    first = generate(engine, prompt, 16, sampling=sampling)
    second = generate(engine, prompt, 16, sampling=sampling)
    other = generate(engine, prompt, 16, sampling=SamplingParams(temperature=1.0, seed=99))
    assert first.token_ids == second.token_ids
    assert first.token_ids != other.token_ids
    only_the_likeliest = SamplingParams(temperature=5.0, seed=99, top_k=1)
    assert generate(engine, prompt, 16, sampling=only_the_likeliest).token_ids == (
        generate(engine, prompt, 16).token_ids
    ), "top_k 1 is greedy, however hot the temperature"


def test_cancelling_mid_decode_frees_everything(
    real_model: RealModel, make_engine: EngineFactory
) -> None:
    engine, _ = make_engine()
    request_id = engine.submit("agent", real_model.tokenizer.render_chat(QUESTION), max_tokens=64)
    for _ in range(4):
        engine.step()
    engine.cancel(request_id)
    done = completions(run_until_idle(engine))[request_id]
    assert isinstance(done, CompletionEvent)
    assert done.finish_reason is FinishReason.CANCELLED
    engine.release_blocks(request_id)
    assert engine.pool.used_count == 0


def test_a_finished_reply_keeps_the_kv_of_every_token_it_returned(
    real_model: RealModel, make_engine: EngineFactory
) -> None:
    """So a client that sends the reply back hits all of it, its last token included."""
    engine, _ = make_engine()
    prompt = real_model.tokenizer.render_chat([ChatMessage("user", "Tell me a story.")])
    done = generate(engine, prompt, 6)
    assert done.finish_reason is FinishReason.MAX_TOKENS
    assert done.blocks is not None
    assert done.blocks.n_tokens == len(prompt) + len(done.token_ids)


def test_sampled_and_greedy_requests_share_a_batch_without_changing_each_other(
    real_model: RealModel, make_engine: EngineFactory
) -> None:
    engine, _ = make_engine()
    prompt = real_model.tokenizer.render_chat([ChatMessage("user", "Tell me a story.")])
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=7)
    alone_seeded = generate(engine, prompt, 12, sampling=seeded).token_ids
    alone_greedy = generate(engine, prompt, 12).token_ids
    sampled = engine.submit("a", prompt, max_tokens=12, sampling=seeded)
    greedy = engine.submit("b", prompt, max_tokens=12)
    done = completions(run_until_idle(engine))
    assert done[sampled].token_ids == alone_seeded
    assert done[greedy].token_ids == alone_greedy


def test_a_prompt_riding_the_decode_steps_gets_what_it_gets_in_passes_of_its_own(
    real_model: RealModel, make_engine: EngineFactory
) -> None:
    """Same chunks either way (30 tokens: two streams leave 30 rows of the fused pass):
    the fused pass must change when they are computed, never the results."""
    tokenizer = real_model.tokenizer
    streams = [
        tokenizer.render_chat([ChatMessage("user", f"Write about {topic}.")])
        for topic in ("the sea", "mountains")
    ]
    long_prompt = tokenizer.render_chat(conversation(3, 200, counter(real_model)))
    results = []
    for pacer in (PacerConfig(ride_ratio=1e6), PacerConfig(ride_ratio=None, busy_tokens=30)):
        engine, backend = make_engine(pacer=pacer)
        rides: list[int] = []

        def spy(
            ride: PromptChunk | None = None, step: Any = backend.decode_step, seen: Any = rides
        ) -> StepOutput:
            seen.append(0 if ride is None else len(ride.tokens))
            return step(ride)  # type: ignore[no-any-return]  # the real method

        backend.decode_step = spy  # type: ignore[method-assign]  # counting rides
        ids = [engine.submit("s", p, max_tokens=16) for p in streams]
        events = engine.step().events + engine.step().events
        ids.append(engine.submit("long", long_prompt, max_tokens=8))
        done = completions(events + run_until_idle(engine))
        results.append(([done[i].token_ids for i in ids], max(rides)))
    (riding, most_ridden), (alone, never) = results
    assert most_ridden == 30
    assert never == 0
    assert riding == alone


def test_a_restored_cache_that_cannot_be_gathered_fails_only_its_request(
    real_model: RealModel, make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A returning agent's restored prefix is copied into the batch as it joins; when that
    copy fails, the agents already decoding carry on untouched."""
    tokenizer = real_model.tokenizer
    earlier = tokenizer.render_chat(conversation(5, 300, counter(real_model)))
    question = tokenizer.render_chat(QUESTION)
    engine, _ = make_engine()
    first = generate(engine, earlier, 2)
    stored = first.blocks
    full = [*earlier, *first.token_ids, *question[-12:]]  # few new tokens: read in place
    alone = generate(engine, question, 12).token_ids

    def no_room(*_: Any) -> Any:
        raise MemoryError("no room to gather the restored prefix")

    monkeypatch.setattr(RestoredCaches, "gathered", no_room)
    other = engine.submit("other", question, max_tokens=12)
    engine.step()
    returning = engine.submit("agent", full, stored, max_tokens=8)
    done = completions(run_until_idle(engine))
    assert done[returning].finish_reason is FinishReason.ERROR
    assert "no room" in (done[returning].error or "")
    assert done[other].token_ids == alone


def test_a_prompt_sliced_between_layers_gets_what_it_gets_in_whole_passes(
    real_model: RealModel, make_engine: EngineFactory
) -> None:
    tokenizer = real_model.tokenizer
    prompt = tokenizer.render_chat(conversation(6, 600, counter(real_model)))
    question = tokenizer.render_chat(QUESTION)
    engine, backend = make_engine(pacer=PacerConfig(slice_ratio=0.5))
    alone = generate(engine, prompt, 16).token_ids
    stream_alone = generate(engine, question, 200).token_ids
    paused: list[bool] = []
    beside: list[bool] = []
    slice_of, begin_of = backend.prefill_slice, backend.begin_decode_step

    def watched(*args: Any, **kwargs: Any) -> Any:
        progress = slice_of(*args, **kwargs)
        paused.append(not progress.done)
        return progress

    def begun() -> bool:
        beside.append(begin_of())
        return beside[-1]

    backend.prefill_slice = watched  # type: ignore[method-assign]  # a spy on the real method
    backend.begin_decode_step = begun  # type: ignore[method-assign]  # a spy on the real method
    stream = engine.submit("stream", question, max_tokens=200)
    engine.step()
    late = engine.submit("late", prompt, max_tokens=16)
    done = completions(run_until_idle(engine))
    assert any(paused)  # some chunks stopped between layers and went on in later rounds
    # where this machine has OpenBLAS and our kernels, the stream's steps ran beside the
    # slices (a core each): neither side's tokens changed
    assert any(beside) == (backend._beside is not None)  # noqa: SLF001 - whether it can
    assert done[late].token_ids == alone
    assert done[stream].token_ids == stream_alone


def test_attention_a_run_of_heads_at_a_time_leaves_a_whole_steps_bits(
    real_model: RealModel, make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slices stop between runs of KV heads and between the MLP's two products; the KV they
    leave must be bit for bit what one step each per layer leaves (every later layer's KV
    depends on the MLPs before it), or sliced and whole prompts would differ."""
    _, backend = make_engine()
    prompt = real_model.tokenizer.render_chat(conversation(4, 300, counter(real_model)))
    greedy = SamplingParams(temperature=0.0)

    def sliced_kv(seconds: float) -> list[np.ndarray]:
        backend.open_sequence("s", restored=None, n_restored=0, n_new=len(prompt), sampling=greedy)
        for start in range(0, len(prompt), 256):
            chunk = prompt[start : start + 256]
            while not backend.prefill_slice("s", chunk, seconds, last=False).done:
                pass
        caches = backend._sequences["s"].caches  # noqa: SLF001 - the KV is what is compared
        kv = [np.array(c.keys[..., : c.offset, :]) for c in caches]
        kv += [np.array(c.values[..., : c.offset, :]) for c in caches]
        backend.close_sequence("s", 0)
        return kv

    by_heads = sliced_kv(0.0)  # one step a round: every pause there can be
    monkeypatch.setattr(layer_slice, "SPLIT_MIN_TOKENS", 10**9)
    whole = sliced_kv(math.inf)
    assert len(by_heads) == len(whole) == 2 * len(real_model.loaded.model.model.layers)
    assert all(np.array_equal(a, b) for a, b in zip(by_heads, whole, strict=True))


def test_a_chunk_riding_with_rows_that_all_fail_to_join_is_computed_alone(
    real_model: RealModel, make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The returning agent is the decode batch's only row and its cache cannot be built, so
    no decode pass runs: the prompt that was to ride it must not lose its chunk."""
    tokenizer = real_model.tokenizer
    earlier = tokenizer.render_chat(conversation(8, 300, counter(real_model)))
    question = tokenizer.render_chat(QUESTION)
    engine, _ = make_engine(pacer=PacerConfig(ride_ratio=50.0))
    first = generate(engine, earlier, 2)
    alone = generate(engine, question, 8).token_ids

    def no_room(*_: Any) -> Any:
        raise MemoryError("no room to gather the restored prefix")

    monkeypatch.setattr(RestoredCaches, "gathered", no_room)
    returning = engine.submit("agent", [*earlier, *first.token_ids, *question[-12:]], first.blocks)
    engine.step()  # its first token, from a pass that reads the restored blocks in place
    rider = engine.submit("rider", question, max_tokens=8)
    done = completions(run_until_idle(engine))
    assert done[returning].finish_reason is FinishReason.ERROR
    assert done[rider].token_ids == alone
