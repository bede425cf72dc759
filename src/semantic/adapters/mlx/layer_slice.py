"""A prompt chunk computed a few layers at a time, so long prompts and streams share rounds.

Riding (``fused_pass``) puts a small chunk into each decode step, and small chunks are
inefficient: every one reads all the weights again, and a ride holds at most 28 rows. A
slice keeps an efficient chunk (128 tokens) and instead pauses between layers: each round
runs the streams' decode step, then the chunk's next layers for a set time, and the chunk's
hidden states wait in memory for the next round. Evaluated layer by layer, a 4,043-token
prompt in 128-token chunks took 10.9 s here, against 11.0 s in whole 512-token passes, and
one layer of a 128-token chunk takes 8-14 ms (at 0 to 4,000 tokens of context), the
granularity of a round's time. ADR 0009 has the measured curve.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_attention_mask


@dataclass(slots=True)
class LayerSlice:
    """A chunk's hidden states between layers, and the masks its layers use."""

    hidden: mx.array
    masks: list[Any]
    next_layer: int = 0

    @classmethod
    def start(cls, body: Any, tokens: Sequence[int], caches: list[Any]) -> LayerSlice:
        """Embed the chunk and make its masks, as mlx-lm's llama body does before its
        first layer (the masks depend on the caches' offsets, which the layers move)."""
        hidden = body.embed_tokens(mx.array([list(tokens)]))
        full = create_attention_mask(hidden, caches[getattr(body, "fa_idx", 0)])
        swa_idx = getattr(body, "swa_idx", None)
        window = None
        if swa_idx is not None:
            window = create_attention_mask(hidden, caches[swa_idx], window_size=body.sliding_window)
        masks = [window if getattr(layer, "use_sliding", False) else full for layer in body.layers]
        return cls(hidden, masks)

    def advance(
        self,
        body: Any,
        caches: list[Any],
        seconds: float,
        clock: Callable[[], float] = time.perf_counter,
    ) -> bool:
        """Run layers while the next is expected to end within ``seconds`` (at least one;
        the last layer's time predicts the next). True once every layer has run, with
        ``hidden`` then the body's final (normed) output."""
        started = clock()
        layers = body.layers
        while self.next_layer < len(layers):
            began = clock()
            index = self.next_layer
            cache = caches[index]
            self.hidden = layers[index](self.hidden, self.masks[index], cache=cache)
            mx.eval(self.hidden, cache.keys, cache.values)
            self.next_layer += 1
            now = clock()
            if now - started + (now - began) / 2 > seconds:
                break
        if self.next_layer < len(layers):
            return False
        self.hidden = body.norm(self.hidden)
        return True
