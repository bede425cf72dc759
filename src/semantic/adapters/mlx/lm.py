"""The parts of mlx-lm this package uses, imported with what that import does to the
process undone (``import_guards``): every module here takes mlx-lm's names from this one,
so mlx-lm is first imported here, whichever module comes first."""

from __future__ import annotations

from semantic.adapters.mlx.import_guards import process_kept

with process_kept():
    from mlx_lm import load
    from mlx_lm.models import gemma3_text, llama, phi3, qwen2, qwen3
    from mlx_lm.models.activations import swiglu
    from mlx_lm.models.base import create_attention_mask
    from mlx_lm.models.cache import BatchKVCache, KVCache, RotatingKVCache, make_prompt_cache
    from mlx_lm.models.rope_utils import Llama3RoPE
    from mlx_lm.sample_utils import apply_top_k, apply_top_p

__all__ = [
    "BatchKVCache",
    "KVCache",
    "Llama3RoPE",
    "RotatingKVCache",
    "apply_top_k",
    "apply_top_p",
    "create_attention_mask",
    "gemma3_text",
    "llama",
    "load",
    "make_prompt_cache",
    "phi3",
    "qwen2",
    "qwen3",
    "swiglu",
]
