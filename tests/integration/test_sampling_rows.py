"""A batch's rows drawn by their own samplers: each row's token is the one it would draw
alone, whichever samplers share the batch (greedy rows are drawn in one call)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from semantic.adapters.mlx.sampling import greedy, make_sampler, sampled_rows
from semantic.domain.generation import SamplingParams

VOCAB = 64


def test_mixed_samplers_draw_each_rows_own_token() -> None:
    logits = mx.array(np.random.default_rng(1).standard_normal((5, VOCAB)).astype(np.float32))
    params = [
        SamplingParams(),
        SamplingParams(temperature=0.7, seed=3),
        SamplingParams(),
        SamplingParams(logit_bias=((5, 100.0),)),
        SamplingParams(temperature=0.9, seed=4, frequency_penalty=1.0),
    ]
    batched = np.asarray(sampled_rows(logits, [make_sampler(p) for p in params])).tolist()
    alone = [make_sampler(p)(logits[i : i + 1]).item() for i, p in enumerate(params)]
    assert batched == alone
    assert batched[3] == 5
    assert batched[0] == int(np.argmax(np.asarray(logits[0])))


def test_rows_sharing_one_sampler_are_drawn_in_one_call() -> None:
    calls: list[int] = []

    def counted(rows: mx.array) -> mx.array:
        calls.append(rows.shape[0])
        return greedy(rows)

    logits = mx.array(np.random.default_rng(2).standard_normal((4, VOCAB)).astype(np.float32))
    own = make_sampler(SamplingParams(temperature=0.5, seed=1))
    drawn = np.asarray(sampled_rows(logits, [counted, own, counted, counted])).tolist()
    assert calls == [3]
    likeliest = np.argmax(np.asarray(logits), axis=-1)
    assert [drawn[i] for i in (0, 2, 3)] == likeliest[[0, 2, 3]].tolist()
