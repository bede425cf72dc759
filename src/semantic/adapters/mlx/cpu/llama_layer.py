"""One llama-bodied decoder layer (llama, Llama 3, Mistral, Qwen2, Qwen3) as the steps our
fast paths run: the one place outside mlx-lm where a layer's body is written.

mlx-lm's ``TransformerBlock`` computes ``h = x + attention(norm(x))`` then
``h + mlp(norm(h))``. The fused pass (``fused_pass``) runs it on rows stacked from several
sequence groups, the layer slice (``layer_slice``) a few steps per round, and the C pass
(``host_model``) reads its weights in this order; each takes the steps from here, so a
model feature (a bias, a head norm, another MLP) is added once, and the three cannot drift
apart (``test_llama_layer``: the fused pass and the slice give the same bits). The ops are
mlx-lm's own modules, so the bits are a whole layer's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from semantic.adapters.mlx.cpu import host_swiglu
from semantic.adapters.mlx.cpu.attention import HostSoftmaxAttention
from semantic.adapters.mlx.lm import swiglu


@dataclass(frozen=True, slots=True)
class LlamaLayer:
    block: Any
    """mlx-lm's layer: ``input_layernorm``, ``self_attn`` (our ``HostSoftmaxAttention``
    where the fast paths run), ``post_attention_layernorm``, ``mlp``."""

    @property
    def attention(self) -> HostSoftmaxAttention:
        attention: HostSoftmaxAttention = self.block.self_attn
        return attention

    # -- attention: norm and projections, then each group's heads, then the output ----------

    def project(self, hidden: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """Queries, keys and values of the normed rows (biases and head norms included)."""
        return self.attention.project(self.block.input_layernorm(hidden))

    def attended(self, hidden: mx.array, mixed: mx.array) -> mx.array:
        """The residual after attention: the heads' outputs projected and added."""
        out: mx.array = hidden + self.attention.inner.o_proj(mixed)
        return out

    def attend_whole(self, hidden: mx.array, mask: Any, cache: Any) -> mx.array:
        """The attention half in one call of the module (its cache updated)."""
        out: mx.array = hidden + self.block.self_attn(
            self.block.input_layernorm(hidden), mask, cache
        )
        return out

    # -- the MLP: whole, or its three products -----------------------------------------------

    def mlp(self, hidden: mx.array) -> mx.array:
        """The MLP half in one call of the module (any MLP mlx-lm has)."""
        out: mx.array = hidden + self.block.mlp(self.block.post_attention_layernorm(hidden))
        return out

    def gate(self, hidden: mx.array) -> tuple[mx.array, mx.array]:
        """The MLP's first product: the normed rows and their gate (``model_parts.MLPS``)."""
        normed = self.block.post_attention_layernorm(hidden)
        return normed, self.block.mlp.gate_proj(normed)

    def gated(self, normed: mx.array, gate: mx.array) -> mx.array:
        """The second: the up projection, gated (SwiGLU: the MLP's own, ``host_swiglu``)."""
        up = self.block.mlp.up_proj(normed)
        if isinstance(self.block.mlp, host_swiglu.HostSwigluMLP):
            return host_swiglu.swiglu(gate, up)
        out: mx.array = swiglu(gate, up)
        return out

    def mlp_out(self, hidden: mx.array, gated: mx.array) -> mx.array:
        """The third: the down projection, added."""
        out: mx.array = hidden + self.block.mlp.down_proj(gated)
        return out

    # -- the weights, as the C pass reads them -----------------------------------------------

    def norms(self) -> tuple[Any, Any]:
        """The RMS norms before attention and before the MLP."""
        return self.block.input_layernorm, self.block.post_attention_layernorm

    def linears(self) -> list[Any]:
        """q, k, v, o, gate, up, down: the order of the C ``layer_t``."""
        a, mlp = self.attention.inner, self.block.mlp
        return [a.q_proj, a.k_proj, a.v_proj, a.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]

    def head_norms(self) -> list[Any]:
        """Qwen3's RMS norms of each head's queries and keys; none for the others."""
        a = self.attention.inner
        return [a.q_norm, a.k_norm] if "q_norm" in a else []
