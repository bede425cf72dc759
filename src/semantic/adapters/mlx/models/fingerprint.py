"""The model fingerprint: what must match for stored KV to be valid for this model.

It covers the weights (their bytes), the tokenizer, the chat template and config, the KV
dtype, the block size and the block file format. Any change gives a new fingerprint, hence
new block ids: old blocks are never served to a different model (ADR 0005).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import xxhash

from semantic.domain.cache_spec import ModelCacheSpec

_CHUNK = 16 << 20


def model_fingerprint(
    model_dir: Path, spec: ModelCacheSpec, storage_format: str, attention: str
) -> str:
    config_files = ("tokenizer_config.json", "config.json", "chat_template.jinja")
    tokenizer_files = ("tokenizer.json", "tokenizer.model")
    parts = {
        "weights": _digest(sorted(model_dir.glob("model*.safetensors"))),
        "tokenizer": _digest([model_dir / n for n in tokenizer_files if (model_dir / n).exists()]),
        "template_and_config": _digest(
            [model_dir / n for n in config_files if (model_dir / n).exists()]
        ),
        "kv_dtype": spec.kv_dtype,
        "block_tokens": spec.block_tokens,
        "layers": list(spec.layer_windows),
        "storage_format": storage_format,
        "attention": attention,
    }
    encoded = json.dumps(parts, sort_keys=True).encode()
    return hashlib.blake2b(encoded, digest_size=16).hexdigest()


def _digest(paths: list[Path]) -> str:
    digest = xxhash.xxh3_128()
    for path in paths:
        digest.update(path.name.encode())
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()
