"""A random-weight model of the embedded model's shape, saved as an mlx-lm model directory.

Speed and exactness do not depend on what the weights say, so a machine that cannot fetch
the embedded model (a lent GPU box, say) still measures the real shapes with it: only the
tokenizer files travel, and the weights are drawn here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models import llama

SMOLLM2_SHAPE = {
    "model_type": "llama",
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "rms_norm_eps": 1e-5,
    "vocab_size": 49152,
    "rope_theta": 100000.0,
    "head_dim": 64,
    "rope_traditional": True,
    "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
"""SmolLM2-135M's shape (FACTS.md)."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def write_random_llama(target: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Draw the weights, save them with ``config.json`` and the tokenizer's files."""
    target.mkdir(parents=True, exist_ok=True)
    mx.random.seed(seed)
    args = llama.ModelArgs.from_dict(SMOLLM2_SHAPE)  # type: ignore[no-untyped-call]  # mlx-lm ships no types
    model = llama.Model(args)
    mx.eval(model.parameters())
    mx.save_safetensors(str(target / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (target / "config.json").write_text(json.dumps(SMOLLM2_SHAPE, indent=1))
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, target / name)
    return target
