"""Rebuild a Hugging Face ``tokenizer.json`` from the vocabulary inside a GGUF file.

transformers' own GGUF loader needs torch; the ``tokenizers`` library alone can rebuild a
byte-level BPE tokenizer from the token list and merges, which is all a GGUF "gpt2"
tokenizer is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

CONTROL_TOKEN_TYPE = 3


class UnsupportedTokenizerError(ValueError):
    """The GGUF carries a tokenizer model this converter does not rebuild."""


def write_tokenizer_files(metadata: Mapping[str, object], out_dir: Path) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` for the GGUF's tokenizer."""
    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise UnsupportedTokenizerError(f"GGUF tokenizer model {kind!r} is not supported (gpt2 is)")
    tokens = _strings(metadata["tokenizer.ggml.tokens"])
    merges = _strings(metadata["tokenizer.ggml.merges"])
    token_types = _ints(metadata["tokenizer.ggml.token_type"])
    control = [
        tok for tok, kind in zip(tokens, token_types, strict=True) if kind == CONTROL_TOKEN_TYPE
    ]

    tokenizer = _byte_level_bpe(tokens, merges)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    tokenizer.save(str(out_dir / "tokenizer.json"))

    bos = tokens[_int(metadata["tokenizer.ggml.bos_token_id"])]
    eos = tokens[_int(metadata["tokenizer.ggml.eos_token_id"])]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": tokens[_int(metadata.get("tokenizer.ggml.padding_token_id", 0))],
        "unk_token": tokens[_int(metadata.get("tokenizer.ggml.unknown_token_id", 0))],
        "add_bos_token": bool(_int(metadata.get("tokenizer.ggml.add_bos_token", 0))),
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": _int(metadata.get("llama.context_length", 2048)),
        "additional_special_tokens": control,
        "chat_template": metadata["tokenizer.chat_template"],
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    special = {k: config[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2))


def _byte_level_bpe(tokens: Sequence[str], merges: Sequence[str]) -> Tokenizer:
    vocab = {token: index for index, token in enumerate(tokens)}
    pairs = [(left, right) for left, right in (merge.split(" ", 1) for merge in merges)]
    bpe = models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False)
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def _strings(value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UnsupportedTokenizerError("expected a list of strings in the GGUF tokenizer metadata")
    return value


def _ints(value: object) -> list[int]:
    as_list = value.tolist() if hasattr(value, "tolist") else value
    if not isinstance(as_list, list):
        raise UnsupportedTokenizerError(
            "expected a list of integers in the GGUF tokenizer metadata"
        )
    return [int(v) for v in as_list]


def _int(value: object) -> int:
    item = value.item() if hasattr(value, "item") else value
    if not isinstance(item, int | bool | float):
        raise UnsupportedTokenizerError(f"expected a number in the GGUF metadata, got {item!r}")
    return int(item)
