"""Per-request samplers with their own random key.

mlx-lm's samplers draw from MLX's global random state, so a request's tokens would depend
on what else shares the batch. Each sampled request here carries its own key, split once per
token, so the same seed gives the same tokens whatever the batch looks like.

Samplers take raw logits: normalising over the vocabulary costs an ``exp`` per entry, slow
on MLX's CPU backend, and only nucleus sampling and the top-token probability need it.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

import mlx.core as mx

from semantic.adapters.mlx.lm import apply_top_k, apply_top_p
from semantic.domain.generation import SamplingParams

Sampler = Callable[[mx.array], mx.array]


def greedy(logits: mx.array) -> mx.array:
    """One shared function object, so a batch of greedy requests samples in one call."""
    return mx.argmax(logits, axis=-1)


def log_softmax(logits: mx.array) -> mx.array:
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def top_prob(logits: mx.array) -> mx.array:
    """Each row's probability of its most likely token."""
    return mx.exp(mx.max(logits, axis=-1) - mx.logsumexp(logits, axis=-1))


def sampled_rows(logits: mx.array, samplers: list[Sampler]) -> mx.array:
    """Each row's token by its sampler; rows sharing one (all greedy ones do) in one call,
    also beside rows with samplers of their own. A row's draw depends on its row alone."""
    if all(s is samplers[0] for s in samplers):
        return samplers[0](logits)
    groups: dict[int, list[int]] = {}
    for row, sampler in enumerate(samplers):
        groups.setdefault(id(sampler), []).append(row)
    order = [row for rows in groups.values() for row in rows]
    drawn = mx.concatenate([samplers[rows[0]](logits[mx.array(rows)]) for rows in groups.values()])
    if order == sorted(order):
        return drawn
    places = [0] * len(order)
    for place, row in enumerate(order):
        places[row] = place
    return drawn[mx.array(places)]


def top_probs(logits: mx.array, tracked: list[bool]) -> mx.array:
    """``top_prob`` for the tracked rows, 0 for the others: normalising costs an ``exp``
    per vocabulary entry, so only the rows that asked pay it."""
    where = [i for i, asked in enumerate(tracked) if asked]
    if not where:
        return mx.zeros((len(tracked),))
    if len(where) == len(tracked):
        return top_prob(logits)
    rows = mx.array(where)
    return mx.zeros((len(tracked),)).at[rows].add(top_prob(logits[rows]))


class SeededSampler:
    def __init__(self, params: SamplingParams) -> None:
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        self._key = mx.random.key(seed)
        self._inverse_temperature = 1.0 / params.temperature
        self._top_p = params.top_p
        self._top_k = params.top_k

    def skip(self) -> None:
        self._key = mx.random.split(self._key)[0]

    def __call__(self, logits: mx.array) -> mx.array:
        keys = mx.random.split(self._key)
        self._key = keys[0]
        if 0 < self._top_k < logits.shape[-1]:  # a ranking: raw logits do as well
            logits = apply_top_k(logits, self._top_k)
        if self._top_p < 1.0:  # the nucleus is cut on probabilities: normalise first
            logits = apply_top_p(log_softmax(logits), self._top_p)
        return mx.random.categorical(logits * self._inverse_temperature, key=keys[1])


class AdjustedSampler:
    """A row's scores moved before its sampler draws: OpenAI's ``logit_bias``, and its
    presence and frequency penalties over the tokens this sampler has drawn (counted here,
    lazily, one vocabulary-wide row of counts per reply)."""

    def __init__(self, inner: Sampler, params: SamplingParams) -> None:
        self.inner = inner
        self._params = params
        self._bias: mx.array | None = None
        self._counts: mx.array | None = None

    @property
    def counts_draws(self) -> bool:
        return self._params.penalized

    def __call__(self, logits: mx.array) -> mx.array:
        width = logits.shape[-1]
        if self._bias is None:
            self._bias = _bias_row(self._params.logit_bias, width)
            self._counts = mx.zeros((width,)) if self._params.penalized else None
        moved = logits + self._bias
        counts = self._counts
        if counts is not None:
            params = self._params
            moved = moved - params.frequency_penalty * counts
            moved = moved - params.presence_penalty * (counts > 0)
        token = self.inner(moved)
        if counts is not None:
            self._counts = counts.at[token].add(1.0)
        return token


def _bias_row(bias: tuple[tuple[int, float], ...], width: int) -> mx.array:
    """The biases as one row of scores; an id past the scores (requests are checked against
    the vocabulary first, ``check_logit_bias``) is left out rather than written past them."""
    row = mx.zeros((width,))
    bias = tuple((token, value) for token, value in bias if token < width)
    if not bias:
        return row
    tokens = mx.array([token for token, _ in bias])
    return row.at[tokens].add(mx.array([value for _, value in bias]))


def skip_draws(sampler: Sampler, n: int) -> None:
    """Advance a seeded sampler past ``n`` tokens it did not draw (a grammar forced them):
    whether they came in one pass or a step each, its later draws are the same. (A
    penalized reply takes no forced tokens: ``SamplingParams.penalized``.)"""
    if isinstance(sampler, AdjustedSampler):
        sampler = sampler.inner
    if isinstance(sampler, SeededSampler):
        for _ in range(n):
            sampler.skip()


def draws_every_token(sampler: Sampler) -> bool:
    """Whether a row's sampler must see every token of its reply drawn (it counts them)."""
    return isinstance(sampler, AdjustedSampler) and sampler.counts_draws


def make_sampler(params: SamplingParams) -> Sampler:
    inner = greedy if params.is_greedy else SeededSampler(params)
    if params.logit_bias or params.penalized:
        return AdjustedSampler(inner, params)
    return inner
