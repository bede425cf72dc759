"""One forward pass for the decode batch and a prompt chunk together (llama-bodied models:
llama, Llama 3, Mistral, Qwen2, Qwen3; ``model_parts``).

A decode step streams every weight matrix once for a few rows; a prompt chunk run as its
own pass streams them all again. Here the two share each product: the batch's rows and the
chunk's rows are stacked for the projections and the MLP, and split only for RoPE, the
cache update and attention, which belong to each sequence group. While the stacked rows
stay within the small-product kernel's reach (ADR 0010), every row gets the bits it gets in
a pass of its own: riding changes when a chunk is computed, never what.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from semantic.adapters.mlx.accelerator import Group
from semantic.adapters.mlx.cpu.attention import HostSoftmaxAttention
from semantic.adapters.mlx.cpu.llama_layer import LlamaLayer
from semantic.adapters.mlx.lm import create_attention_mask
from semantic.adapters.mlx.models.model_parts import is_llama_bodied, not_llama_bodied

MAX_ROWS = 32
"""Stacked rows up to which products use the batch-invariant kernel (ADR 0010)."""


def supports_fusion(model: Any) -> bool:
    """A llama-bodied model with full attention everywhere and our attention installed."""
    return fusion_obstacle(model) is None


def fusion_obstacle(model: Any) -> str | None:
    """Why prompt chunks of this model cannot join a decode step's pass; None if they can."""
    if not is_llama_bodied(model):
        return not_llama_bodied(model)
    inner = model.model
    if getattr(inner, "swa_idx", None) is not None:
        return "sliding-window layers"
    if not all(isinstance(layer.self_attn, HostSoftmaxAttention) for layer in inner.layers):
        return "the host softmax attention is not installed"
    return None


def fused_hidden(model: Any, groups: list[Group]) -> list[mx.array]:
    """The final hidden states ``(batch, length, dim)`` of each group, computed in one pass."""
    if any(g.prefix is not None for g in groups):
        raise ValueError("a restored prefix read in place needs the host pass")
    inner = model.model
    hidden = [inner.embed_tokens(g.tokens) for g in groups]
    masks = [create_attention_mask(h, g.caches[0]) for h, g in zip(hidden, groups, strict=True)]
    shapes = [(g.tokens.shape[0], g.tokens.shape[1]) for g in groups]
    for index, block in enumerate(inner.layers):
        layer = LlamaLayer(block)
        rows = _stack(hidden)
        q, k, v = layer.project(rows)
        pending = [
            layer.attention.begin(part, shape, mask, group.caches[index])
            for part, shape, mask, group in zip(
                _split((q, k, v), shapes), shapes, masks, groups, strict=True
            )
        ]
        mx.eval([p.needed for p in pending])  # one wait for every group's scores
        mixed = [p.finish().reshape(b * n, -1) for p, (b, n) in zip(pending, shapes, strict=True)]
        rows = layer.mlp(layer.attended(rows, mx.concatenate(mixed)))
        hidden = _unstack(rows, shapes)
    return [inner.norm(h) for h in hidden]


def _stack(hidden: list[mx.array]) -> mx.array:
    return mx.concatenate([h.reshape(-1, h.shape[-1]) for h in hidden])


def _unstack(rows: mx.array, shapes: list[tuple[int, int]]) -> list[mx.array]:
    out, start = [], 0
    for batch, length in shapes:
        out.append(rows[start : start + batch * length].reshape(batch, length, -1))
        start += batch * length
    return out


def _split(
    qkv: tuple[mx.array, mx.array, mx.array], shapes: list[tuple[int, int]]
) -> list[tuple[mx.array, mx.array, mx.array]]:
    out, start = [], 0
    for batch, length in shapes:
        end = start + batch * length
        q, k, v = (part[start:end] for part in qkv)
        out.append((q, k, v))
        start = end
    return out
