"""Log-probabilities of drawn tokens and their most likely alternatives, for the rows that
asked: normalising a row costs an ``exp`` per vocabulary entry, so only they pay it.

A row's figures stay lazy (``LazyLogprob``) until its token is reported, so they are
evaluated with the step's other outputs, in the background of the next pass."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from semantic.adapters.mlx.sampling import log_softmax
from semantic.domain.generation import TokenLogprob

FLOOR = -9999.0
"""A drawn token's figure where the scores gave none (OpenAI's floor): JSON has no
infinities, and a reply's body must stay JSON."""

LazyLogprob = tuple[mx.array, mx.array, mx.array]
"""The drawn token's log-probability, the alternatives' ids and theirs, most likely first."""


def lazy_logprobs(
    logits: mx.array, tokens: mx.array, wanted: list[int | None]
) -> list[LazyLogprob | None]:
    """Row ``i`` of ``logits`` (the scores its token was drawn from) with ``wanted[i]``
    alternatives to ``tokens[i]``; None for the rows that asked for none."""
    where = [i for i, top in enumerate(wanted) if top is not None]
    out: list[LazyLogprob | None] = [None] * len(wanted)
    if not where:
        return out
    rows = mx.array(where)
    scores = log_softmax(logits[rows].astype(mx.float32))
    drawn = mx.take_along_axis(scores, tokens.reshape(-1)[rows][:, None], axis=-1)[:, 0]
    most = max(1, *(wanted[i] or 0 for i in where))
    ids = mx.argpartition(-scores, kth=most - 1, axis=-1)[:, :most]
    values = mx.take_along_axis(scores, ids, axis=-1)
    order = mx.argsort(-values, axis=-1)
    ids, values = mx.take_along_axis(ids, order, axis=-1), mx.take_along_axis(values, order, -1)
    for j, i in enumerate(where):
        top = wanted[i] or 0
        out[i] = (drawn[j], ids[j, :top], values[j, :top])
    return out


def arrays_of(lazy: list[LazyLogprob | None]) -> list[mx.array]:
    return [array for entry in lazy if entry is not None for array in entry]


def token_logprob(token: int, lazy: LazyLogprob | None) -> TokenLogprob | None:
    """``lazy`` read (evaluated already, with the step): alternatives a grammar rules out
    (a log-probability of minus infinity) are left out, a drawn token's non-finite figure
    is ``FLOOR``."""
    if lazy is None:
        return None
    drawn, ids, values = lazy
    pairs = zip(np.asarray(ids).tolist(), np.asarray(values).tolist(), strict=True)
    top = tuple((int(i), float(v)) for i, v in pairs if math.isfinite(v))
    value = float(np.asarray(drawn))
    return TokenLogprob(token, value if math.isfinite(value) else FLOOR, top)
