"""Tiny random-weight models of each family mlx-lm serves, saved as ordinary mlx-lm model
directories (config.json, safetensors weights, the embedded model's tokenizer files), so
the server loads them exactly as it loads a user's ``--model DIR``."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_map, tree_map_with_path
from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model

VOCAB = 49_152
"""The embedded tokenizer's vocabulary: every model here shares its tokenizer."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

_LLAMA_BODY: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,  # q8 at rest groups 64 values of a head
    "rms_norm_eps": 1e-5,
    "vocab_size": VOCAB,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}

FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {**_LLAMA_BODY, "model_type": "llama", "rope_theta": 10_000.0},
    "llama3": {
        **_LLAMA_BODY,
        "model_type": "llama",
        "rope_theta": 500_000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 1024,
        },
    },
    "mistral": {**_LLAMA_BODY, "model_type": "mistral", "rope_theta": 1_000_000.0},
    "qwen2": {  # its head size is hidden / heads
        **_LLAMA_BODY,
        "model_type": "qwen2",
        "hidden_size": 128,
        "rope_theta": 1_000_000.0,
    },
    "qwen3": {**_LLAMA_BODY, "model_type": "qwen3", "rope_theta": 1_000_000.0},
    "gemma3_text": {
        "model_type": "gemma3_text",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "query_pre_attn_scalar": 64,
        "vocab_size": VOCAB,
        "sliding_window": 64,
        "sliding_window_pattern": 2,
        "max_position_embeddings": 4096,
    },
    "phi3": {
        **_LLAMA_BODY,
        "model_type": "phi3",
        "hidden_size": 192,  # heads of 96, as Phi-3-mini's
        "rope_theta": 10_000.0,
        "tie_word_embeddings": False,
    },
}


@dataclass(frozen=True, slots=True)
class Variant:
    """One row of the matrix: a family, its weights (float32 or 4-bit) and KV dtype."""

    family: str
    quantized: bool
    dtype: str  # the model's float dtype, and so its KV's: "float32" or "bfloat16"

    @property
    def name(self) -> str:
        return f"{self.family}-{'q4' if self.quantized else 'f32w'}-{self.dtype}"


VARIANTS = [
    Variant(family, quantized, dtype)
    for family in FAMILIES
    for quantized in (False, True)
    for dtype in ("float32", "bfloat16")
]


def build_model_dir(variant: Variant, tokenizer_dir: Path, out: Path) -> Path:
    """Write ``variant`` as an mlx-lm model directory at ``out``, reusing the tokenizer in
    ``tokenizer_dir``."""
    config = FAMILIES[variant.family]
    return write_model_dir(config, tokenizer_dir, out, variant.dtype, variant.quantized)


def write_model_dir(
    config: dict[str, Any],
    tokenizer_dir: Path,
    out: Path,
    dtype: str = "float32",
    quantized: bool = False,
) -> Path:
    """A random model of ``config`` as ``mlx_lm.convert`` would write it: cast, quantized,
    weights and config saved, the tokenizer's files beside them."""
    config = dict(config)
    model_class, args_class = _get_classes(config)
    mx.random.seed(7)
    model = model_class(args_class.from_dict(config))
    _spread_weights(model)
    cast = getattr(mx, dtype)
    model.update(
        tree_map(
            lambda p: p.astype(cast) if mx.issubdtype(p.dtype, mx.floating) else p,
            model.parameters(),
        )
    )
    if quantized:
        model, config = quantize_model(
            model, config, group_size=64, bits=4, quant_predicate=_not_the_vocabulary
        )
    mx.eval(model.parameters())
    out.mkdir(parents=True, exist_ok=True)
    save_model(out, model)
    save_config(config, out / "config.json")
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, out / name)
    return out


def _not_the_vocabulary(path: str, module: Any) -> bool:
    """Every linear layer 4-bit but the embeddings and the output head: MLX's CPU kernels
    for quantized products are slow, and a 49,152-wide head computed at every prompt
    position (mlx-lm's forward does) would take most of the suite's time."""
    return not path.endswith(("embed_tokens", "lm_head"))


def _spread_weights(model: Any) -> None:
    """Larger random projections than mlx's default init, so attention moves the residual
    stream more and a restore that served wrong KV is more likely to change the reply."""

    def grow(path: str, p: mx.array) -> mx.array:
        return p * 3.0 if p.ndim == 2 and "embed" not in path else p

    model.update(tree_map_with_path(grow, model.parameters()))
