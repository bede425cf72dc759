"""One decoding sequence's place in the batch, and what a step reports for it.

A constrained row may be fed, after its input, the tokens its grammar allows alone after
it (a call's ``", "arguments": {"city": "``): the same pass computes them, where each was
a step, and they are reported with the input (ADR 0017). A pass feeds every row of one
batch cache as many tokens, so only a row alone in its cache takes such runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from semantic.adapters.mlx.logprobs import (
    LazyLogprob,
    arrays_of,
    lazy_logprobs,
    token_logprob,
)
from semantic.adapters.mlx.sampling import Sampler, skip_draws
from semantic.ports.grammar import GrammarMatcher
from semantic.ports.model_backend import DecodedToken


@dataclass(slots=True)
class Row:
    seq_id: str
    sampler: Sampler
    track_top_prob: bool
    remaining: int
    has_output: bool = False
    """False until the row's first pass: its first input was already reported by prefill."""
    matcher: GrammarMatcher | None = None
    """A constrained row's grammar, told every token the row reports."""
    own: list[Any] | None = None
    """Its own plain caches, a group of its own in the batch's pass (a constrained row,
    which takes its forced runs there); None: a row of the shared batch cache."""
    told: bool = False
    """Its matcher was told this step's input before the pass (to find ``run``)."""
    run: tuple[int, ...] = ()
    """Tokens its grammar forces after this step's input, fed in the same pass."""
    logprobs: int | None = None
    """Alternatives each token's log-probability comes with; None: no log-probabilities
    (a row that wants them takes no runs: a run's tokens are not drawn)."""
    pending: LazyLogprob | None = None
    """The log-probability of the token it feeds next, computed with that token's draw."""

    def take_run(self, token: int, stop: frozenset[int], limit: int) -> tuple[int, ...]:
        """Tell the matcher this step's input ``token`` (unless prefill told it) and take
        the run of at most ``limit`` tokens forced after it (none after a stop token)."""
        assert self.matcher is not None  # only constrained rows take runs
        if self.has_output:
            self.matcher.accept(token)
        self.told = True
        room = min(limit, self.remaining - self.has_output)
        if token not in stop and room > 0:
            self.run = self.matcher.take_forced(room)
            skip_draws(self.sampler, len(self.run))  # as if sampled: the same draws after
        return self.run

    def fed_now(self, token: int) -> tuple[int, ...]:
        """What this step reports for the row: its input (unless prefill reported it),
        then its run."""
        return (*((token,) if self.has_output else ()), *self.run)

    def leaving(self, token: int, stop: frozenset[int]) -> bool:
        """Whether this step's tokens end the row (its budget, or a stop token)."""
        fed = self.fed_now(token)
        return bool(fed) and (self.remaining <= len(fed) or any(t in stop for t in fed))

    def reported(
        self, token: int, top: float, stop: frozenset[int], logprob: LazyLogprob | None = None
    ) -> list[DecodedToken]:
        """This step's tokens for the row, up to the one that finishes it; a run's tokens
        each the only one its mask allowed (a probability of 1), and each after the first
        reported together with the one before it. ``logprob``: the input's (evaluated)."""
        tops: Sequence[float] = [top] if self.has_output else []
        tops = [*tops, *(1.0 for _ in self.run)]
        fed = self.fed_now(token)
        self.told, self.run, self.has_output = False, (), True
        out = []
        for index, (fed_token, fed_top) in enumerate(zip(fed, tops, strict=True)):
            self.remaining -= 1
            finished = self.remaining <= 0 or fed_token in stop
            shown = fed_top if self.track_top_prob else None
            drawn = token_logprob(fed_token, logprob) if index == 0 else None
            out.append(DecodedToken(self.seq_id, fed_token, shown, finished, index > 0, drawn))
            if finished:
                break
        return out


def hold_logprobs(rows: list[Row], logits: mx.array, drawn: mx.array) -> list[mx.array]:
    """Each row that wants them keeps the log-probabilities of the token just ``drawn``
    for it (lazily: reported with that token, next step); the arrays to evaluate."""
    wanted = [row.logprobs for row in rows]
    if all(top is None for top in wanted):
        return []
    lazy = lazy_logprobs(logits, drawn, wanted)
    for row, entry in zip(rows, lazy, strict=True):
        row.pending = entry
    return arrays_of(lazy)
