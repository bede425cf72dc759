"""A random-weight model of the embedded model's shape, saved as an mlx-lm model directory.

Speed and exactness do not depend on what the weights say, so a machine that cannot fetch
the embedded model (a lent GPU box, say) still measures the real shapes with it: only the
tokenizer files travel, and the weights are drawn here.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models import llama, qwen3

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

QWEN3_SMOLLM2_SHAPE = {
    **SMOLLM2_SHAPE,
    "model_type": "qwen3",
    "rope_theta": 1_000_000.0,
    "rope_traditional": False,
}
"""A Qwen3 body (per-head q/k RMS norms) of SmolLM2's size: the fast paths' cost for Qwen3
beside llama's, on the same shapes (issue 36's fairness check)."""

SHAPES = {"llama": (llama, SMOLLM2_SHAPE), "qwen3": (qwen3, QWEN3_SMOLLM2_SHAPE)}

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def write_random_llama(target: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Draw the weights, save them with ``config.json`` and the tokenizer's files."""
    return write_random_model(target, tokenizer_dir, "llama", seed)


def write_random_model(target: Path, tokenizer_dir: Path, family: str, seed: int = 0) -> Path:
    """``write_random_llama`` for one of ``SHAPES``."""
    module, shape = SHAPES[family]
    target.mkdir(parents=True, exist_ok=True)
    mx.random.seed(seed)
    args = module.ModelArgs.from_dict(shape)
    model = module.Model(args)
    mx.eval(model.parameters())
    mx.save_safetensors(str(target / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (target / "config.json").write_text(json.dumps(shape, indent=1))
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, target / name)
    return target


def main() -> None:
    """``python -m benchmarks.random_model --family qwen3 DIR``: a model directory to pass
    to ``semantic serve --model`` or ``python -m benchmarks.fairness --model``."""
    from semantic.adapters.cli.progress import ProgressPrinter
    from semantic.bootstrap import prepare_model
    from semantic.config import Settings

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("target", type=Path)
    parser.add_argument("--family", choices=sorted(SHAPES), default="llama")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tokenizer_dir, _ = prepare_model(Settings(), ProgressPrinter())
    print(write_random_model(args.target, tokenizer_dir, args.family, args.seed))


if __name__ == "__main__":
    main()
