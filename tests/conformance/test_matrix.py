"""The conformance matrix: every family, float32 and 4-bit weights, float32 and bfloat16 KV,
through the real services in-process: persist, restart, restore, fork, four sequences
batched, and KV kept 8-bit at rest.

Exact rows compare greedy replies: a restored conversation must continue as a cold prefill
of the same prompt does, and a sequence decoded beside three others as it does alone. The
models are random but attend enough that a wrong position's KV changes the reply
(``test_the_models_replies_depend_on_early_context``)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from semantic.application.chat.generation import GenerationResult
from semantic.bootstrap import Services
from semantic.config import Settings
from semantic.domain.tokens import common_prefix
from tests.conformance.conftest import ModelDirs
from tests.conformance.serving import (
    NAMESPACE,
    REPLY_TOKENS,
    HostKV,
    Order,
    chat_prompt,
    next_prompt,
    plain,
    served_kv_dtype,
    serving,
    settings_for,
    stored_kv,
    together,
    turn,
    words,
)
from tests.conformance.test_serve import SERVED
from tests.conformance.tiny_models import FAMILIES, VARIANTS, VOCAB, Variant

pytestmark = pytest.mark.model  # the embedded model's tokenizer

Q8_ROWS = set(SERVED)
"""Rows that also keep KV 8-bit at rest (two more restarts each): one per family, each
weight format and each KV dtype among them."""


FEATURES: dict[str, Callable[[Any], bool]] = {
    "llama": lambda attention: type(attention.rope).__name__ == "RoPE",
    "llama3": lambda attention: type(attention.rope).__name__ == "Llama3RoPE",
    "mistral": lambda attention: type(attention.rope).__name__ == "RoPE",
    "qwen2": lambda attention: "bias" in attention.q_proj and "bias" in attention.v_proj,
    "qwen3": lambda attention: hasattr(attention, "q_norm") and hasattr(attention, "k_norm"),
    "gemma3_text": lambda attention: attention.is_sliding,
    "phi3": lambda attention: hasattr(attention, "qkv_proj"),
}
"""What each family's row is there for, as mlx-lm builds its first attention layer."""


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_each_row_is_the_model_it_stands_for(variant: Variant, model_dir: ModelDirs) -> None:
    model, config = load_model(model_dir(variant))
    assert config["model_type"] == FAMILIES[variant.family]["model_type"]
    layer = model.model.layers[0]
    assert FEATURES[variant.family](layer.self_attn)
    projection = layer.mlp.down_proj
    assert ("scales" in projection) == variant.quantized  # a QuantizedLinear
    weights = projection.scales if variant.quantized else projection.weight
    assert weights.dtype == getattr(mx, variant.dtype)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_the_models_replies_depend_on_early_context(variant: Variant, model_dir: ModelDirs) -> None:
    """Random weights, yet a token far back mostly changes the greedy reply: a restore that
    served the wrong KV for early positions would not go unseen."""
    model, _ = load_model(model_dir(variant))
    rng = random.Random(variant.name)
    changed = 0
    for _ in range(3):
        prompt = [rng.randrange(1_000, VOCAB) for _ in range(80)]
        other = [*prompt[:2], prompt[2] + 1, *prompt[3:]]
        changed += _greedy(model, prompt, REPLY_TOKENS) != _greedy(model, other, REPLY_TOKENS)
    assert changed >= 2


def _greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    cache = make_prompt_cache(model)
    tokens = [*prompt]
    for _ in range(n):
        fed = tokens if len(tokens) == len(prompt) else tokens[-1:]
        logits = model(mx.array([fed]), cache=cache)[0, -1]
        token = mx.argmax(logits).item()
        assert isinstance(token, int)
        tokens.append(token)
    return tokens[len(prompt) :]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_a_conversation_survives_restarts_forks_and_batching(
    variant: Variant, model_dir: ModelDirs, tmp_path: Path
) -> None:
    """Each server life runs in a loop of its own (``asyncio.run``): the matrix needs no
    asyncio plugin, so a device check runs it with plain pytest."""
    asyncio.run(_conversation(variant, settings_for(model_dir(variant), tmp_path / "data")))


async def _conversation(variant: Variant, settings: Settings) -> None:
    rng = random.Random(variant.name)
    async with serving(settings) as services:
        assert services.spec.kv_dtype == served_kv_dtype(variant)
        await services.agents.create(NAMESPACE, "a", None)
        first = await turn(services, "a", f"Remember this: {words(rng, 250)}")
        assert first.usage.prompt_tokens > services.spec.block_tokens  # a whole block and more
    order = Order()
    async with serving(settings, order) as services:
        prompt, cold = await _restored_turn_equals_a_cold_one(
            services, rng, first.usage.prompt_tokens
        )
        await _forked_and_batched_equal_alone(services, rng, (prompt, cold), order)
        exact = await stored_kv(services, "cold", prompt) if variant in Q8_ROWS else None
    if exact is not None:
        await _kv_kept_8_bit_at_rest_is_restored(settings, prompt, exact)


async def _restored_turn_equals_a_cold_one(
    services: Services, rng: random.Random, first_prompt: int
) -> tuple[tuple[int, ...], str]:
    """The agent's next turn after a restart restores its first turn from disk and replies
    as a cold prefill of the same prompt does; returns that prompt and reply."""
    question = f"What came after {words(rng, 3)}? {words(rng, 20)}"
    prompt = await next_prompt(services, "a", question)
    warm = await turn(services, "a", question)
    cold = await plain(services, prompt, namespace="cold")
    assert warm.usage.prompt_tokens == len(prompt)
    assert first_prompt <= warm.usage.cached_tokens < len(prompt)
    assert services.cache.stats.disk_restored_tokens >= first_prompt
    assert cold.usage.cached_tokens == 0
    assert warm.text == cold.text, "a restored conversation must continue as a cold one"
    return prompt, cold.text


async def _forked_and_batched_equal_alone(
    services: Services, rng: random.Random, done: tuple[tuple[int, ...], str], order: Order
) -> None:
    """The agent, its fork, the last prompt again and a new one, decoded in one batch,
    each reply as the same prompt's alone and cold (``done``: a prompt and its cold reply)."""
    prompt, cold = done
    await services.agents.fork(NAMESPACE, "a", "b")
    questions = {agent: f"And {words(rng, 12)}?" for agent in ("a", "b")}
    prompts = [await next_prompt(services, agent, q) for agent, q in questions.items()]
    fresh = chat_prompt(services, words(rng, 60))
    prompts.append(fresh)
    order.seen.clear()
    batched: list[GenerationResult] = await together(
        services,
        [
            *(turn(services, agent, q) for agent, q in questions.items()),
            plain(services, prompt),
            plain(services, fresh),
        ],
    )
    assert order.seen[:4] == ["first"] * 4, "the four sequences decode side by side"
    cached = [r.usage.cached_tokens for r in batched]
    assert min(cached[:2]) >= len(prompt), "the agent and its fork restore their turns"
    # The new conversation shares the template's system prompt with the stored ones, but
    # sliding-window layers keep only a stored conversation's last positions, not its start.
    slides = any(window is not None for window in services.spec.layer_windows)
    assert cached[2:] == [len(prompt) - 1, 0 if slides else common_prefix(fresh, prompt)]
    alone = [await plain(services, p, namespace=f"alone-{i}") for i, p in enumerate(prompts)]
    texts = [r.text for r in alone]
    assert [r.text for r in batched] == [*texts[:2], cold, texts[2]]


async def _kv_kept_8_bit_at_rest_is_restored(
    settings: Settings, prompt: tuple[int, ...], exact: HostKV
) -> None:
    """Saved 8-bit, the prompt's KV comes back after a restart within one quantization step
    of the exact KV, block for block, and serves the prompt again."""
    q8 = dataclasses.replace(settings, kv_at_rest="q8")
    async with serving(q8) as services:  # blocks of another storage format are not read
        assert (await plain(services, prompt, namespace="q8")).usage.cached_tokens == 0
    async with serving(q8) as services:
        restored = await stored_kv(services, "q8", prompt)
        again = await plain(services, prompt, namespace="q8")
    assert again.usage.cached_tokens == len(prompt) - 1
    assert restored.keys() == exact.keys()
    for where, arrays in exact.items():
        for want, got in zip(arrays, restored[where], strict=True):
            assert got.shape == want.shape, where
            step = (want.max() - want.min()) / 255  # the widest group's step, 8 bits
            bound = step + np.abs(want) * 2**-7  # and a bfloat16 rounding
            assert np.all(np.abs(got - want) <= bound), where
