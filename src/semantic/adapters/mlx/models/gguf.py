"""Convert a llama-family GGUF file into an ordinary MLX model directory.

The result (config.json, model.safetensors, tokenizer files) loads with ``mlx_lm.load``
like any mlx-community model. ``mx.load`` already reads GGUF quantized tensors as MLX
affine-quantized triples (weight, scales, biases); we rename them, optionally dequantize,
and write the config that mlx-lm's llama model expects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from enum import StrEnum
from pathlib import Path

import mlx.core as mx

from semantic.adapters.mlx.errors import UnsupportedModelError
from semantic.adapters.mlx.models.gguf_tokenizer import write_tokenizer_files

GGUF_GROUP_SIZE = 32

Progress = Callable[[str, int, int], None]
"""Called as ``progress(stage, done, total)``."""


class WeightFormat(StrEnum):
    """How the converted weights are stored.

    ``quantized`` (or ``q4``) keeps the GGUF's 4/8-bit weights: an eighth of float32's
    bytes, and on a CPU with our kernels (ADR 0031) the same bits as float32, faster.
    ``q8`` stores every quantized tensor again in 8 bits (groups of 32, nearly the GGUF's
    4-bit grid exactly), the format of 8-bit models. float32 is the dequantized copy;
    ``bf16`` that copy rounded to bfloat16, the format of most published checkpoints.
    """

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BF16 = "bf16"
    QUANTIZED = "quantized"
    Q8 = "q8"

    @classmethod
    def named(cls, choice: str) -> WeightFormat:
        """``--weights``: a format's value, or ``q4``, the GGUF's own 4-bit."""
        return cls.QUANTIZED if choice == "q4" else cls(choice)


_NARROWED = {WeightFormat.FLOAT16: mx.float16, WeightFormat.BF16: mx.bfloat16}
"""Formats that store the dequantized copy's floats narrower."""


class GGUFConversionError(UnsupportedModelError):
    """The GGUF is not a model this converter understands."""


_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|scales|biases|bias)$")
_TOP = re.compile(r"^([a-z_]+)\.(weight|scales|biases|bias)$")


def convert_gguf(
    gguf_path: Path, out_dir: Path, weight_format: WeightFormat, progress: Progress
) -> None:
    """Write the MLX model directory for ``gguf_path`` into ``out_dir`` (which must exist)."""
    try:
        loaded = mx.load(str(gguf_path), return_metadata=True)
    except (RuntimeError, ValueError) as error:
        raise GGUFConversionError(
            f"MLX could not read {gguf_path} ({error}). It reads GGUF tensors of types F32, "
            f"F16, Q4_0, Q4_1 and Q8_0; re-quantize others (K-quants, IQ) to Q8_0 or Q4_0 "
            f"with llama.cpp's llama-quantize --allow-requantize, or convert the original "
            f"checkpoint with mlx_lm.convert."
        ) from error
    if not isinstance(loaded, tuple):
        raise GGUFConversionError(f"{gguf_path} did not load as GGUF")
    tensors, metadata = loaded
    if metadata.get("general.architecture") != "llama":
        raise GGUFConversionError(
            f"only llama-architecture GGUF files are supported, got "
            f"{metadata.get('general.architecture')!r}"
        )
    config = llama_config(metadata)
    weights = _convert_tensors(tensors, weight_format, progress)
    if weight_format is WeightFormat.QUANTIZED and (bits := _widest_bits(weights)):
        # mlx-lm reads each layer's own bits from its shapes; this is the default
        config["quantization"] = {"group_size": GGUF_GROUP_SIZE, "bits": bits}
    if weight_format is WeightFormat.Q8:
        config["quantization"] = {"group_size": GGUF_GROUP_SIZE, "bits": 8}
    config["tie_word_embeddings"] = "lm_head.weight" not in weights
    narrowed = _NARROWED.get(weight_format)
    config["torch_dtype"] = "float32" if narrowed is None else str(narrowed).rsplit(".", 1)[-1]
    progress("writing weights", 0, 1)
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    progress("writing weights", 1, 1)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer_files(metadata, out_dir)


def llama_config(metadata: Mapping[str, object]) -> dict[str, object]:
    """The mlx-lm llama config for the GGUF's ``llama.*`` sizes.

    GGUF stores the Q and K rows permuted for llama.cpp's interleaved RoPE, which is what
    mlx-lm calls ``rope_traditional``.
    """

    def num(key: str) -> float:
        value = metadata[f"llama.{key}"]
        item = value.item() if hasattr(value, "item") else value
        if not isinstance(item, int | float):
            raise GGUFConversionError(f"llama.{key} is not a number")
        return item

    heads = int(num("attention.head_count"))
    hidden = int(num("embedding_length"))
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": int(num("block_count")),
        "intermediate_size": int(num("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(num("attention.head_count_kv")),
        "head_dim": int(num("rope.dimension_count"))
        if "llama.rope.dimension_count" in metadata
        else hidden // heads,
        "rms_norm_eps": float(num("attention.layer_norm_rms_epsilon")),
        "vocab_size": int(num("vocab_size")),
        "rope_theta": float(num("rope.freq_base")),
        "rope_traditional": True,
        "max_position_embeddings": int(num("context_length")),
        "bos_token_id": _meta_int(metadata, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _meta_int(metadata, "tokenizer.ggml.eos_token_id"),
    }


def _convert_tensors(
    tensors: Mapping[str, mx.array], weight_format: WeightFormat, progress: Progress
) -> dict[str, mx.array]:
    renamed = {_mlx_name(name): value for name, value in tensors.items()}
    out: dict[str, mx.array] = {}
    stems = sorted({name.rsplit(".", 1)[0] for name in renamed})
    for done, stem in enumerate(stems, start=1):
        weight = renamed[f"{stem}.weight"]
        scales = renamed.get(f"{stem}.scales")
        if scales is None or weight_format is WeightFormat.QUANTIZED:
            for suffix in ("weight", "scales", "biases", "bias"):
                if f"{stem}.{suffix}" in renamed:
                    out[f"{stem}.{suffix}"] = renamed[f"{stem}.{suffix}"]
        elif weight_format is WeightFormat.Q8:
            dense = _dequantize(weight, scales, renamed[f"{stem}.biases"])
            packed = mx.quantize(dense, group_size=GGUF_GROUP_SIZE, bits=8)
            names = (f"{stem}.weight", f"{stem}.scales", f"{stem}.biases")
            out |= dict(zip(names, packed, strict=True))
        else:
            out[f"{stem}.weight"] = _dequantize(weight, scales, renamed[f"{stem}.biases"])
        narrowed = _NARROWED.get(weight_format)
        if narrowed is not None and out[f"{stem}.weight"].dtype == mx.float32:
            out[f"{stem}.weight"] = out[f"{stem}.weight"].astype(narrowed)
        mx.eval(out[f"{stem}.weight"])
        progress("converting tensors", done, len(stems))
    return out


def _bits(weight: mx.array, scales: mx.array) -> int:
    return int(weight.shape[-1] * 32 // (scales.shape[-1] * GGUF_GROUP_SIZE))


def _widest_bits(weights: Mapping[str, mx.array]) -> int | None:
    """The most bits any quantized tensor has (a Q4 file keeps some tensors Q8_0)."""
    found = [
        _bits(weights[name.removesuffix("scales") + "weight"], scales)
        for name, scales in weights.items()
        if name.endswith(".scales")
    ]
    return max(found, default=None)


def _dequantize(weight: mx.array, scales: mx.array, biases: mx.array) -> mx.array:
    bits = _bits(weight, scales)
    return mx.dequantize(
        weight,
        scales.astype(mx.float32),
        biases.astype(mx.float32),
        group_size=GGUF_GROUP_SIZE,
        bits=bits,
    ).astype(mx.float32)


def _mlx_name(gguf_name: str) -> str:
    if match := _BLOCK.match(gguf_name):
        layer, part, suffix = match.groups()
        if part not in _LAYER_NAMES:
            raise GGUFConversionError(f"unknown GGUF tensor {gguf_name!r}")
        return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{suffix}"
    if (match := _TOP.match(gguf_name)) and match.group(1) in _TOP_NAMES:
        return f"{_TOP_NAMES[match.group(1)]}.{match.group(2)}"
    raise GGUFConversionError(f"unknown GGUF tensor {gguf_name!r}")


def _meta_int(metadata: Mapping[str, object], key: str) -> int:
    value = metadata[key]
    item = value.item() if hasattr(value, "item") else value
    if not isinstance(item, int):
        raise GGUFConversionError(f"{key} is not an integer")
    return item
