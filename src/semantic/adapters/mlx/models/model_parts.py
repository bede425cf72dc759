"""A llama-bodied model as its transformer body and its output head (tied to the embeddings
or not): the one place that knows which of mlx-lm's model classes share llama's body.

Llama (with or without Llama 3 RoPE scaling, and Mistral, which mlx-lm builds with its llama
class), Qwen2 (q/k/v biases) and Qwen3 (RMS norms on each head's queries and keys) have the
same layer: RMS norm, attention, residual, RMS norm, SwiGLU MLP, residual, and the same
body (``model.model``: ``embed_tokens``, ``layers``, ``norm``). What counts is those
classes, not the ``model_type`` string."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlx_lm.models import llama, qwen2, qwen3

LLAMA_BODIED = (llama.Model, qwen2.Model, qwen3.Model)
"""Models whose body is llama's."""
LLAMA_BODIED_NAMES = "llama-bodied models (llama, Llama 3, mistral, qwen2, qwen3)"
"""How logs and ``GET /v1/models/{id}`` name them."""

ATTENTIONS = (llama.Attention, qwen2.Attention, qwen3.Attention)
"""Their attention modules: projections (biases optional), per-head q/k RMS norms (Qwen3
only), RoPE through the module's own ``rope``, then scaled dot-product attention."""
MLPS = (llama.MLP, qwen2.MLP, qwen3.MLP)
"""Their MLPs: ``down(swiglu(gate(x), up(x)))``."""

_HOW_THEY_DIFFER = {
    "gemma3_text": "sliding-window layers, (1 + w) norms before and after each block, "
    "a GELU MLP, scaled embeddings",
    "phi3": "fused qkv and gate-up projections (and LongRoPE scaling in its long models)",
}
"""What a few other families' layers do that llama's do not (for the message only: the
decision is ``is_llama_bodied``, by class)."""


def is_llama_bodied(model: Any) -> bool:
    return isinstance(model, LLAMA_BODIED)


def not_llama_bodied(model: Any) -> str:
    """Why a path for llama-bodied models skips this one, for the log and the models API."""
    kind = getattr(model, "model_type", None) or type(model).__module__.rsplit(".", 1)[-1]
    differs = _HOW_THEY_DIFFER.get(str(kind))
    return f"model type {kind}: {LLAMA_BODIED_NAMES} only" + (f" ({differs})" if differs else "")


@dataclass(frozen=True, slots=True)
class BodyAndHead:
    """A llama-bodied model as its transformer body and its output head, so a prompt chunk
    that needs no logits skips the head (49,152 x 576 for SmolLM2), and the last chunk
    computes it for one position instead of all of them."""

    body: Any
    head: Any

    @classmethod
    def of(cls, model: Any) -> BodyAndHead | None:
        if not is_llama_bodied(model):  # llama's body, whatever its model_type says
            return None
        if getattr(model.args, "tie_word_embeddings", False):
            return cls(model.model, model.model.embed_tokens.as_linear)
        return cls(model.model, model.lm_head)
