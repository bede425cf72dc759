"""The one description of a llama-bodied layer (``llama_layer``): the fused pass and the
layer slice both run its steps, so a prompt through either gives the same bits, hidden
states and caches alike, with mlx-lm's SwiGLU or the C pass's (``host_swiglu``); a change
to one path that the other lacks fails here."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache

from semantic.adapters.mlx.accelerator import Group
from semantic.adapters.mlx.cpu import host_swiglu
from semantic.adapters.mlx.cpu.attention import install
from semantic.adapters.mlx.cpu.fused_pass import fused_hidden
from semantic.adapters.mlx.cpu.layer_slice import SPLIT_MIN_TOKENS, LayerSlice, StepTimes
from tests.helpers import tiny_family

FAMILIES = ("llama", "qwen2", "qwen3")
"""Plain, with q/k/v biases, with per-head q/k norms."""


def _model(family: str, swiglu: str) -> Any:
    if swiglu == "host":  # heads of 64, which the C pass (and so its SwiGLU) needs
        model = tiny_family(
            family, num_key_value_heads=2, num_attention_heads=4, hidden_size=256, head_dim=64
        )
        assert install(model)
        assert host_swiglu.install(model)
        return model
    model = tiny_family(family, num_key_value_heads=2, num_attention_heads=4)
    assert install(model)
    return model


def _caches(model: Any) -> list[Any]:
    return [KVCache() for _ in model.model.layers]  # type: ignore[no-untyped-call]  # mlx-lm


def _sliced(model: Any, tokens: list[int], caches: list[Any]) -> tuple[mx.array, LayerSlice]:
    chunk = LayerSlice.start(model.model, tokens, caches, StepTimes())
    while not chunk.advance(model.model, caches, 0.0):  # one step a round
        pass
    return chunk.hidden, chunk


@pytest.mark.parametrize("swiglu", ["mlx-lm", "host"])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_fused_pass_and_the_slice_give_the_same_bits(family: str, swiglu: str) -> None:
    model = _model(family, swiglu)
    prefix = [int(t) for t in np.random.default_rng(1).integers(3, 500, 40)]
    tokens = [int(t) for t in np.random.default_rng(2).integers(3, 500, SPLIT_MIN_TOKENS + 8)]
    fused_caches, sliced_caches = _caches(model), _caches(model)
    for caches in (fused_caches, sliced_caches):
        model.model(mx.array([prefix]), cache=caches)
    fused = fused_hidden(model, [Group(mx.array([tokens]), fused_caches)])[0]
    sliced, chunk = _sliced(model, tokens, sliced_caches)
    assert chunk.head_runs  # the heads in runs and the MLP in three products
    assert chunk.split_mlp
    assert np.array_equal(np.asarray(fused), np.asarray(sliced))
    for ours, theirs in zip(fused_caches, sliced_caches, strict=True):
        assert np.array_equal(np.asarray(ours.keys), np.asarray(theirs.keys))
        assert np.array_equal(np.asarray(ours.values), np.asarray(theirs.values))
