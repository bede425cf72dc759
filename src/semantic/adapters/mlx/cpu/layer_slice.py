"""A prompt chunk computed a few steps at a time, so a long prompt and streams share rounds.

Riding (``fused_pass``) puts a small chunk into each decode step, and small chunks are
inefficient: every one reads all the weights again, and a ride holds at most 28 rows. A
slice keeps an efficient chunk (256 tokens) and pauses inside the model instead: each round
runs the streams' decode step, then the chunk's next steps for a set time, and the chunk's
hidden states wait in memory for the next round. A step is a part of a llama layer (its
projections, its attention over a run of KV heads, or one of its MLP's products), so a
round can end close to its time: attention grows with the context, and for a 256-token
chunk at ~4,000 tokens a whole attention step took 27-35 ms against the MLP's 9-12; a round
whose next step did not fit left that much of its time unused. Split so, a layer's steps
took 4-14 ms at that context. A layer of another family (Gemma 3's, Phi-3's) is one
step, mlx-lm's own module. Each KV head's scores are their own product in MLX's
batched matmul either way, so a step per head gives the whole step's bits. Evaluated layer
by layer, a 4,043-token prompt in 256-token chunks took 10.3 s here, against 11.0 s
in whole 512-token passes. ADR 0009 has the measured curve.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from semantic.adapters.mlx.cpu.attention import HostSoftmaxAttention, PendingAttention
from semantic.adapters.mlx.cpu.llama_layer import LlamaLayer
from semantic.adapters.mlx.models.model_parts import LLAMA_LAYERS, MLPS, embedded, layer_masks

ONE_CORE_SLOWER = 1.6
"""A slice's steps on one core against both: a 4,043-token prompt alone took 22.1 s sliced
with one thread, against 13.4-15.3 s with two (and 21.7-22.3 s with a decode step's body
running all along on the other core). Learning it per step made rounds end early: a
step's time on one core varies with what the other core does."""
ATTENTION_STEPS = 3
"""A layer's attention is split over at most this many steps, a run of KV heads each."""
SPLIT_MIN_TOKENS = 64
"""Shorter chunks attend in one step: their attention is short."""


@dataclass(slots=True)
class _Attending:
    """A layer's attention between its steps: every head's inputs, the finished heads'
    outputs ``(batch, length, heads * head_dim)`` in head order."""

    queries: mx.array
    keys: mx.array
    values: mx.array
    mixed: list[mx.array] = field(default_factory=list)


@dataclass(slots=True)
class LayerSlice:
    """A chunk's hidden states between steps, and the masks its layers use. A layer's steps
    are its attention (with the cache update), or the projections and the cache update then
    one step per run of KV heads in ``head_runs`` (the last with the output projection);
    then its MLP, whole or in three products. The steps are ``llama_layer``'s (the fused
    pass runs the same), mlx-lm's own modules, so the bits are a whole layer's."""

    hidden: mx.array
    masks: list[Any]
    size_cache: Callable[[Any], None] | None = None
    """Sizes an empty layer cache for the prompt's new tokens, before that layer's attention:
    sizing all thirty at once (~190 MB of fresh memory for 4,000 tokens) took 70-115 ms,
    a round of its own; one layer's share fits beside a step."""
    head_runs: tuple[range, ...] = ()
    """The KV heads each attention step takes; empty: mlx-lm's attention, in one step."""
    next_step: int = 0
    last_seconds: list[float] = field(default_factory=list)
    """Each step of a layer's last time, which predicts the next of its place (the backend
    hands them from one chunk to the next)."""
    split_mlp: bool = False
    """Whether a layer's MLP is three steps: the gate, the up and gated product, the down."""
    whole_layers: bool = False
    """Whether each layer is one step, mlx-lm's own module called whole (a layer that is not
    llama's, such as Gemma 3's or Phi-3's: its bits are mlx-lm's by construction)."""
    _attending: _Attending | None = None
    _gating: tuple[mx.array, mx.array] | None = None
    _gated: mx.array | None = None

    @classmethod
    def start(
        cls,
        body: Any,
        tokens: Sequence[int],
        caches: list[Any],
        timings: StepTimes,
        size_cache: Callable[[Any], None] | None = None,
    ) -> LayerSlice:
        """Embed the chunk and make its masks, as mlx-lm's body does before its first
        layer (the masks depend on the caches' offsets, which the layers move)."""
        hidden = embedded(body, mx.array([list(tokens)]))
        masks = layer_masks(body, hidden, caches)
        whole = not all(type(layer) in LLAMA_LAYERS for layer in body.layers)
        runs = _head_runs(body.layers) if len(tokens) >= SPLIT_MIN_TOKENS and not whole else ()
        split_mlp = bool(runs) and all(isinstance(layer.mlp, MLPS) for layer in body.layers)
        chunk = cls(hidden, masks, size_cache, runs, split_mlp=split_mlp, whole_layers=whole)
        chunk.last_seconds = timings.predict(chunk.attention_steps, chunk.mlp_steps)
        return chunk

    @property
    def times(self) -> StepTimes:
        split = self.attention_steps
        return StepTimes(tuple(self.last_seconds[:split]), tuple(self.last_seconds[split:]))

    @property
    def attention_steps(self) -> int:
        return 1 + len(self.head_runs)  # the projections, then each run of heads

    @property
    def mlp_steps(self) -> int:
        if self.whole_layers:
            return 0  # in the layer's one step
        return 3 if self.split_mlp else 1

    @property
    def steps_per_layer(self) -> int:
        return self.attention_steps + self.mlp_steps

    def advance(
        self,
        body: Any,
        caches: list[Any],
        seconds: float,
        clock: Callable[[], float] = time.perf_counter,
        *,
        must_progress: bool = True,
        between: Callable[[], bool] | None = None,
    ) -> bool:
        """Run steps while the next is expected to end within ``seconds`` (the first one
        regardless, if ``must_progress``): a round's time is a ceiling, since the streams'
        worst gap is what suffers. ``between`` runs before each step and says whether work
        beside this thread leaves the step one core (its time then predicts nothing).
        True once every layer has run, with ``hidden`` then the body's final (normed)
        output."""
        started = clock()
        per_layer = self.steps_per_layer
        steps = per_layer * len(body.layers)
        ran = not must_progress
        while self.next_step < steps:
            one_core = between is not None and between()
            coming = self.last_seconds[self.next_step % per_layer]
            if ran and clock() - started + coming * (ONE_CORE_SLOWER if one_core else 1) > seconds:
                break
            began = clock()
            layer = self.next_step // per_layer
            self._step(body.layers[layer], caches[layer], self.masks[layer])
            if not one_core:
                self.last_seconds[self.next_step % per_layer] = clock() - began
            self.next_step += 1
            ran = True
        if self.next_step < steps:
            return False
        self.hidden = body.norm(self.hidden)
        return True

    def _step(self, layer: Any, cache: Any, mask: Any) -> None:
        part = self.next_step % self.steps_per_layer
        if part == 0 and self.size_cache is not None:
            self.size_cache(cache)
        if self.whole_layers:
            self.hidden = layer(self.hidden, mask, cache)
            mx.eval(self.hidden, cache.keys, cache.values)
        elif part >= self.attention_steps:
            self._mlp_step(LlamaLayer(layer), part - self.attention_steps)
        elif self.head_runs:
            self._attend_heads(LlamaLayer(layer), cache, mask, part)
        else:
            self.hidden = LlamaLayer(layer).attend_whole(self.hidden, mask, cache)
            mx.eval(self.hidden, cache.keys, cache.values)

    def _mlp_step(self, layer: LlamaLayer, part: int) -> None:
        """mlx-lm's MLP, whole or in its three products: the gate, the up projection with
        the gated product, then the down projection. The ops are the MLP's own, so the bits
        are too; steps of ~3-5 ms, where the whole MLP's ~9-12 ms (or its gate and up
        together, ~10) often did not fit what was left of a round."""
        if not self.split_mlp:
            self.hidden = layer.mlp(self.hidden)
            mx.eval(self.hidden)
        elif part == 0:
            self._gating = layer.gate(self.hidden)
            mx.eval(self._gating)
        elif part == 1:
            gating = self._gating
            assert gating is not None  # the MLP's first step made it
            self._gating, self._gated = None, layer.gated(*gating)
            mx.eval(self._gated)
        else:
            assert self._gated is not None  # the MLP's second step made it
            self.hidden = layer.mlp_out(self.hidden, self._gated)
            self._gated = None
            mx.eval(self.hidden)

    def _attend_heads(self, layer: LlamaLayer, cache: Any, mask: Any, part: int) -> None:
        attention = layer.attention
        if part == 0:
            batch, length, _ = self.hidden.shape
            projected = layer.project(self.hidden)
            queries, keys, values = attention.heads(projected, (batch, length), cache)
            mx.eval(queries, cache.keys, cache.values)
            self._attending = _Attending(queries, keys, values)
            return
        state = self._attending
        assert state is not None  # the layer's first attention step made it
        heads = self.head_runs[part - 1]
        group = state.queries.shape[1] // state.keys.shape[1]
        pending = PendingAttention.start(
            state.queries[:, heads.start * group : heads.stop * group],
            state.keys[:, heads.start : heads.stop],
            state.values[:, heads.start : heads.stop],
            attention.inner.scale,
            mask,
        )
        mx.eval(pending.needed)
        state.mixed.append(pending.finish())
        if part < len(self.head_runs):
            mx.eval(state.mixed[-1])
            return
        self._attending = None
        self.hidden = layer.attended(self.hidden, mx.concatenate(state.mixed, axis=-1))
        mx.eval(self.hidden)


@dataclass(frozen=True, slots=True)
class StepTimes:
    """A chunk's last time for each step of a layer, by kind, handed to the next chunk."""

    attention: tuple[float, ...] = ()
    mlp: tuple[float, ...] = ()

    def predict(self, attention: int, mlp: int) -> list[float]:
        """Each step's predicted time, matched by kind: the last chunk's layer may have had
        another number of steps of either kind (a short chunk takes one of each), and then
        each kind's total is spread over the steps it has now."""
        if len(self.attention) == attention and len(self.mlp) == mlp:
            return [*self.attention, *self.mlp]
        return _spread(self.attention, attention) + _spread(self.mlp, mlp)


def _spread(times: Sequence[float], steps: int) -> list[float]:
    return [sum(times) / steps] * steps if steps else []


def _head_runs(layers: Sequence[Any]) -> tuple[range, ...]:
    """Runs of KV heads, one per attention step, as even as they come; none unless every
    layer has our attention in float32 (the host path, whose bits a test holds equal)."""
    if not all(isinstance(layer.self_attn, HostSoftmaxAttention) for layer in layers):
        return ()
    if layers[0].self_attn.inner.q_proj.weight.dtype != mx.float32:
        return ()
    kv_heads = layers[0].self_attn.inner.n_kv_heads
    steps = min(kv_heads, ATTENTION_STEPS)
    if steps < 2:
        return ()
    bounds = [round(i * kv_heads / steps) for i in range(steps + 1)]
    return tuple(range(a, b) for a, b in itertools.pairwise(bounds))
