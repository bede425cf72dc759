"""A llama model as its transformer body and its output head (tied to the embeddings or
not): the one place that knows how mlx-lm's llama model splits. Models that mlx-lm builds
with its llama class under another name (Mistral, say) are llama here too: what counts is
the layers, not the ``model_type`` string."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlx_lm.models import llama


@dataclass(frozen=True, slots=True)
class BodyAndHead:
    """A llama model as its transformer body and its output head, so a prompt chunk that
    needs no logits skips the head (49,152 x 576 for SmolLM2), and the last chunk computes
    it for one position instead of all of them."""

    body: Any
    head: Any

    @classmethod
    def of(cls, model: Any) -> BodyAndHead | None:
        if not isinstance(model, llama.Model):  # llama's body, whatever its model_type says
            return None
        if getattr(model.args, "tie_word_embeddings", False):
            return cls(model.model, model.model.embed_tokens.as_linear)
        return cls(model.model, model.lm_head)
