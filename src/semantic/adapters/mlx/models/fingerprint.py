"""The model fingerprint: what must match for stored KV to be valid for this model.

It covers the weights (their bytes), the tokenizer, the chat template and config, the KV
dtype, the block size and the block file format. Any change gives a new fingerprint, hence
new block ids: old blocks are never served to a different model (ADR 0005). The weights'
digest may come from a ``DigestMemo`` (the same value, without reading the files again).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import xxhash

from semantic.adapters.mlx.models.digest_memo import DigestMemo
from semantic.domain.cache_spec import ModelCacheSpec

_CHUNK = 16 << 20


def model_fingerprint(
    model_dir: Path,
    spec: ModelCacheSpec,
    storage_format: str,
    attention: str,
    memo: DigestMemo | None = None,
) -> str:
    config_files = ("tokenizer_config.json", "config.json", "chat_template.jinja")
    tokenizer_files = ("tokenizer.json", "tokenizer.model")
    parts = {
        "weights": _weights_digest(sorted(model_dir.glob("model*.safetensors")), memo),
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


def _weights_digest(paths: list[Path], memo: DigestMemo | None) -> str:
    return memo.digest(paths, _digest) if memo is not None and paths else _digest(paths)


def _digest(paths: Sequence[Path]) -> str:
    digest = xxhash.xxh3_128()
    for path in paths:
        digest.update(path.name.encode())
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()
