"""A prompt chunk computed a few steps at a time, so a long prompt and streams share rounds.

Riding (``fused_pass``) puts a small chunk into each decode step, and small chunks are
inefficient: every one reads all the weights again, and a ride holds at most 28 rows. A
slice keeps an efficient chunk (256 tokens) and pauses inside the model instead: each round
runs the streams' decode step, then the chunk's next steps for a set time, and the chunk's
hidden states wait in memory for the next round. A step is half a llama layer (its
attention, or its MLP), so a round can end close to its time: a whole layer of a 256-token
chunk took 14 ms at the start of a prompt and 31 ms at 4,000 tokens of context. Evaluated
layer by layer, a 4,043-token prompt in 256-token chunks took 10.3 s here, against 11.0 s
in whole 512-token passes. ADR 0009 has the measured curve.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_attention_mask


@dataclass(slots=True)
class LayerSlice:
    """A chunk's hidden states between steps, and the masks its layers use. Step ``2i`` is
    layer ``i``'s attention (and the cache update), step ``2i + 1`` its MLP; the sums are
    mlx-lm's ``TransformerBlock`` written out, so the bits are a whole layer's."""

    hidden: mx.array
    masks: list[Any]
    size_cache: Callable[[Any], None] | None = None
    """Sizes an empty layer cache for the prompt's new tokens, before that layer's attention:
    sizing all thirty at once (~190 MB of fresh memory for 4,000 tokens) took 70-115 ms,
    a round of its own; one layer's share fits beside a step."""
    next_step: int = 0
    last_seconds: list[float] = field(default_factory=lambda: [0.0, 0.0])
    """The last attention step's time and the last MLP step's: each predicts its next (the
    backend hands them from one chunk to the next)."""

    @classmethod
    def start(
        cls,
        body: Any,
        tokens: Sequence[int],
        caches: list[Any],
        timings: Sequence[float],
        size_cache: Callable[[Any], None] | None = None,
    ) -> LayerSlice:
        """Embed the chunk and make its masks, as mlx-lm's llama body does before its
        first layer (the masks depend on the caches' offsets, which the layers move)."""
        hidden = body.embed_tokens(mx.array([list(tokens)]))
        full = create_attention_mask(hidden, caches[getattr(body, "fa_idx", 0)])
        swa_idx = getattr(body, "swa_idx", None)
        window = None
        if swa_idx is not None:
            window = create_attention_mask(hidden, caches[swa_idx], window_size=body.sliding_window)
        masks = [window if getattr(layer, "use_sliding", False) else full for layer in body.layers]
        return cls(hidden, masks, size_cache, last_seconds=list(timings))

    def advance(
        self,
        body: Any,
        caches: list[Any],
        seconds: float,
        clock: Callable[[], float] = time.perf_counter,
    ) -> bool:
        """Run steps while the next is expected to end within ``seconds`` (at least one
        step): a round's time is a ceiling, since the streams' worst gap is what suffers.
        True once every layer has run, with ``hidden`` then the body's final (normed)
        output."""
        started = clock()
        steps = 2 * len(body.layers)
        while self.next_step < steps:
            began = clock()
            self._step(body.layers[self.next_step // 2], caches[self.next_step // 2])
            self.last_seconds[self.next_step % 2] = clock() - began
            self.next_step += 1
            coming = self.last_seconds[self.next_step % 2]
            if clock() - started + coming > seconds:
                break
        if self.next_step < steps:
            return False
        self.hidden = body.norm(self.hidden)
        return True

    def _step(self, layer: Any, cache: Any) -> None:
        h = self.hidden
        if self.next_step % 2 == 0:
            if self.size_cache is not None:
                self.size_cache(cache)
            mask = self.masks[self.next_step // 2]
            self.hidden = h + layer.self_attn(layer.input_layernorm(h), mask, cache)
            mx.eval(self.hidden, cache.keys, cache.values)
        else:
            self.hidden = h + layer.mlp(layer.post_attention_layernorm(h))
            mx.eval(self.hidden)
