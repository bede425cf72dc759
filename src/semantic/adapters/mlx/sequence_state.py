"""A sequence's state on the MLX backend while its prompt runs, and its first token drawn."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from semantic.adapters.mlx.accelerator import PromptSlice
from semantic.adapters.mlx.kv.kv_blocks import History
from semantic.adapters.mlx.kv.restored_prefix import RestoredPrefix
from semantic.adapters.mlx.lm import KVCache
from semantic.adapters.mlx.logprobs import arrays_of, lazy_logprobs, token_logprob
from semantic.adapters.mlx.sampling import Sampler, top_prob
from semantic.adapters.mlx.token_mask import masked
from semantic.ports.grammar import GrammarMatcher
from semantic.ports.model_backend import SampledToken


@dataclass(slots=True)
class SequenceState:
    """One sequence the backend holds from ``open_sequence`` until it decodes."""

    caches: list[Any]
    sampler: Sampler
    track_top_prob: bool
    room: int = 0
    """Positions its prompt still adds: an empty cache is sized for them at the first
    chunk that is not also the last (a prompt prefilled whole sizes itself)."""
    prefix: RestoredPrefix | None = None
    """Restored positions not yet copied into ``caches``, which hold what follows them."""
    slice: PromptSlice | None = None
    """A chunk part way through the layers (``prefill_slice``)."""
    matcher: GrammarMatcher | None = None
    """The grammar every token of a constrained sequence is drawn within."""
    history: History | None = None
    """Its sliding layers' windows as its prompt ended (``window_history``)."""
    logprobs: int | None = None
    """Alternatives each token's log-probability comes with; None: no log-probabilities."""


def sample_first(sequence: SequenceState, logits: mx.array) -> SampledToken:
    """A prompt's first token; a constrained sequence's grammar allows it and is told."""
    if sequence.matcher is not None:
        logits = masked(logits, [sequence.matcher])
    token = sequence.sampler(logits)
    top = top_prob(logits)[0] if sequence.track_top_prob else None
    lazy = lazy_logprobs(logits, token, [sequence.logprobs])
    mx.eval(token, *([top] if top is not None else []), *arrays_of(lazy))
    drawn = scalar_int(token)
    shown = scalar_float(top) if top is not None else None
    sampled = SampledToken(drawn, shown, token_logprob(drawn, lazy[0]))
    if sequence.matcher is not None:
        sequence.matcher.accept(sampled.token)
    return sampled


def fresh_plain(sequence: SequenceState) -> bool:
    """Whether its prompt may join a padded batch: plain empty caches, nothing restored."""
    return sequence.prefix is None and all(
        type(c) is KVCache and c.offset == 0 for c in sequence.caches
    )


def scalar_int(array: mx.array) -> int:
    value = array.item()
    if not isinstance(value, int):
        raise TypeError(f"expected an integer token id, got {value!r}")
    return value


def scalar_float(array: mx.array) -> float:
    value = array.item()
    if not isinstance(value, int | float):
        raise TypeError(f"expected a real number, got {value!r}")
    return float(value)
