"""Per-request samplers with their own random key.

mlx-lm's samplers draw from MLX's global random state, so a request's tokens would depend
on what else shares the batch. Each sampled request here carries its own key, split once per
token, so the same seed gives the same tokens whatever the batch looks like.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_p

from semantic.domain.generation import SamplingParams

Sampler = Callable[[mx.array], mx.array]


def greedy(logprobs: mx.array) -> mx.array:
    """One shared function object, so a batch of greedy requests samples in one call."""
    return mx.argmax(logprobs, axis=-1)


class SeededSampler:
    def __init__(self, params: SamplingParams) -> None:
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        self._key = mx.random.key(seed)
        self._inverse_temperature = 1.0 / params.temperature
        self._top_p = params.top_p

    def __call__(self, logprobs: mx.array) -> mx.array:
        keys = mx.random.split(self._key)
        self._key = keys[0]
        if self._top_p < 1.0:
            logprobs = apply_top_p(logprobs, self._top_p)
        return mx.random.categorical(logprobs * self._inverse_temperature, key=keys[1])


def make_sampler(params: SamplingParams) -> Sampler:
    return greedy if params.is_greedy else SeededSampler(params)
