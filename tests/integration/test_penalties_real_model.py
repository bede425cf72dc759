"""OpenAI's logit_bias and presence and frequency penalties on the real model: the tokens
are those of a plain greedy loop over mlx-lm's own forward that moves the scores the same
way, and a penalized reply is the same alone and in a batch (its counts are its own)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from semantic.application.engine.events import TokenEvent
from semantic.domain.generation import SamplingParams
from tests.helpers import run_until_idle
from tests.integration.conftest import EngineFactory, RealModel
from tests.integration.test_logprobs_real_model import PROMPTS, prompt_of

TOKENS = 12


def replies(
    make_engine: EngineFactory, prompts: list[list[int]], sampling: SamplingParams
) -> list[list[int]]:
    engine, _ = make_engine()
    ids = [
        engine.submit(f"p{i}", prompt, max_tokens=TOKENS, sampling=sampling)
        for i, prompt in enumerate(prompts)
    ]
    events = [e for e in run_until_idle(engine) if isinstance(e, TokenEvent)]
    return [[e.token_id for e in events if e.request_id == request_id] for request_id in ids]


def reference(real_model: RealModel, prompt: list[int], sampling: SamplingParams) -> list[int]:
    """Greedy over mlx-lm's forward of the whole text each step, scores moved in numpy."""
    model = real_model.loaded.model
    ends = real_model.tokenizer.eos_token_ids
    tokens, drawn = list(prompt), []
    counts: np.ndarray | None = None
    for _ in range(TOKENS):
        scores = np.array(model(mx.array([tokens]))[0, -1], dtype=np.float32)
        if counts is None:
            counts = np.zeros_like(scores)
        for token, bias in sampling.logit_bias:
            scores[token] += np.float32(bias)
        scores -= np.float32(sampling.frequency_penalty) * counts
        scores -= np.float32(sampling.presence_penalty) * (counts > 0)
        token = int(np.argmax(scores))
        drawn.append(token)
        if token in ends:
            break
        counts[token] += 1
        tokens.append(token)
    return drawn


def test_penalized_and_biased_tokens_are_those_of_a_plain_loop_alone_and_batched(
    real_model: RealModel, make_engine: EngineFactory
) -> None:
    prompts = [prompt_of(real_model, text) for text in PROMPTS]
    plain = replies(make_engine, prompts, SamplingParams(temperature=0.0))
    bias = ((plain[0][1], -4.0), (plain[1][2], 3.0))  # tokens the plain replies draw
    moved = SamplingParams(
        temperature=0.0, presence_penalty=0.7, frequency_penalty=1.5, logit_bias=bias
    )
    together = replies(make_engine, prompts, moved)
    assert together != plain  # the scores moved enough to change some token
    for prompt, batched in zip(prompts, together, strict=True):
        assert batched == reference(real_model, prompt, moved)
        assert replies(make_engine, [prompt], moved)[0] == batched


def test_a_bias_of_100_draws_its_token_every_time(
    real_model: RealModel, make_engine: EngineFactory
) -> None:
    prompt = prompt_of(real_model, PROMPTS[0])
    forced = SamplingParams(temperature=0.8, seed=3, logit_bias=((1000, 100.0),))
    assert replies(make_engine, [prompt], forced)[0] == [1000] * TOKENS
