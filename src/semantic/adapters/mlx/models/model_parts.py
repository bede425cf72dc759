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

import mlx.core as mx

from semantic.adapters.mlx.lm import create_attention_mask, gemma3_text, llama, phi3, qwen2, qwen3

LLAMA_BODIED = (llama.Model, qwen2.Model, qwen3.Model)
"""Models whose body is llama's."""
LLAMA_BODIED_NAMES = "llama-bodied models (llama, Llama 3, mistral, qwen2, qwen3)"
"""How logs and ``GET /v1/models/{id}`` name them."""

ATTENTIONS = (llama.Attention, qwen2.Attention, qwen3.Attention)
"""Their attention modules: projections (biases optional), per-head q/k RMS norms (Qwen3
only), RoPE through the module's own ``rope``, then scaled dot-product attention."""
MLPS = (llama.MLP, qwen2.MLP, qwen3.MLP)
"""Their MLPs: ``down(swiglu(gate(x), up(x)))``."""
LLAMA_LAYERS = (llama.TransformerBlock, qwen2.TransformerBlock, qwen3.TransformerBlock)
"""Their layers, which a slice may take apart into steps (``layer_slice``)."""

WHOLE_LAYERED = (gemma3_text.Model, phi3.Model)
"""Models whose body a prompt slice can pause between its layers, each layer being
mlx-lm's own module run whole: their embedding and masks are written out below as their
bodies make them (Gemma 3 scales its embeddings and gives sliding layers their own mask;
Phi-3's body is llama's, with fused projections inside the layer)."""
SLICEABLE_NAMES = f"{LLAMA_BODIED_NAMES}, gemma3_text and phi3"
"""Those a prompt slice can pause in, for the log."""

_HOW_THEY_DIFFER = {
    "gemma3_text": "sliding-window layers, (1 + w) norms before and after each block, "
    "a GELU MLP, scaled embeddings",
    "phi3": "fused qkv and gate-up projections (and LongRoPE scaling in its long models)",
}
"""What a few other families' layers do that llama's do not (for the message only: the
decision is ``is_llama_bodied``, by class)."""


def is_llama_bodied(model: Any) -> bool:
    return isinstance(model, LLAMA_BODIED)


def is_sliceable(model: Any) -> bool:
    """Whether ``BodyAndHead.of`` splits it (and so a prompt slice can pause in its body)."""
    return isinstance(model, LLAMA_BODIED + WHOLE_LAYERED)


def not_sliceable(model: Any) -> str:
    kind = getattr(model, "model_type", None) or type(model).__module__.rsplit(".", 1)[-1]
    return f"model type {kind}: {SLICEABLE_NAMES} only"


def not_llama_bodied(model: Any) -> str:
    """Why a path for llama-bodied models skips this one, for the log and the models API."""
    kind = getattr(model, "model_type", None) or type(model).__module__.rsplit(".", 1)[-1]
    differs = _HOW_THEY_DIFFER.get(str(kind))
    return f"model type {kind}: {LLAMA_BODIED_NAMES} only" + (f" ({differs})" if differs else "")


@dataclass(frozen=True, slots=True)
class BodyAndHead:
    """A model as its transformer body and its output head, so a prompt chunk that needs
    no logits skips the head (49,152 x 576 for SmolLM2), and the last chunk computes it for
    one position instead of all of them: llama-bodied models, Gemma 3 and Phi-3, whose
    bodies (``embed_tokens``, ``layers``, ``norm``) end in the final norm."""

    body: Any
    head: Any

    @classmethod
    def of(cls, model: Any) -> BodyAndHead | None:
        if not is_sliceable(model):  # by class, whatever its model_type says
            return None
        if _tied(model):
            return cls(model.model, model.model.embed_tokens.as_linear)
        return cls(model.model, model.lm_head)


def _tied(model: Any) -> bool:
    """Gemma 3 says so on the model (its ``sanitize`` sets it), the others in their args."""
    if isinstance(model, gemma3_text.Model):
        return bool(model.tie_word_embeddings)
    return bool(getattr(model.args, "tie_word_embeddings", False))


def embedded(body: Any, tokens: mx.array) -> mx.array:
    """The hidden states a body's first layer gets, as its own ``__call__`` makes them."""
    hidden: mx.array = body.embed_tokens(tokens)
    if isinstance(body, gemma3_text.Gemma3Model):  # its scale, rounded to bfloat16 as there
        hidden = hidden * mx.array(body.args.hidden_size**0.5, mx.bfloat16).astype(hidden.dtype)
    return hidden


def layer_masks(body: Any, hidden: mx.array, caches: list[Any]) -> list[Any]:
    """Each layer's attention mask, as the body makes them before its first layer (from
    the caches' offsets, which the layers move): Gemma 3's sliding layers (all but every
    ``sliding_window_pattern``-th) get a window; llama's own sliding layers too."""
    if isinstance(body, gemma3_text.Gemma3Model):
        pattern = body.sliding_window_pattern
        full = create_attention_mask(hidden, caches[pattern - 1])
        window = None
        if pattern > 1:
            window = create_attention_mask(hidden, caches[0], window_size=body.window_size)
        return [full if i % pattern == pattern - 1 else window for i in range(len(body.layers))]
    full = create_attention_mask(hidden, caches[getattr(body, "fa_idx", 0)])
    swa_idx = getattr(body, "swa_idx", None)
    window = None
    if swa_idx is not None:
        window = create_attention_mask(hidden, caches[swa_idx], window_size=body.sliding_window)
    return [window if getattr(layer, "use_sliding", False) else full for layer in body.layers]
