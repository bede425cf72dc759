"""The C pass's SwiGLU in the MLPs of prompt chunks on MLX's graph (``host_swiglu``): a
value's bits never depend on its neighbours, it is SwiGLU, and installing it changes only
the MLP's call."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from semantic.adapters.mlx.cpu import host_swiglu
from semantic.adapters.mlx.cpu.attention import install
from semantic.adapters.mlx.lm import swiglu as mlx_swiglu
from tests.helpers import tiny_family

WIDTH = 1536  # SmolLM2's MLP: 300 rows run in several of the kernel's shared runs


def _values(rows: int, seed: int) -> tuple[mx.array, mx.array]:
    rng = np.random.default_rng(seed)
    gate = rng.normal(0.0, 4.0, (rows, WIDTH)).astype(np.float32)
    gate[0, :8] = [0.0, -0.0, 90.0, -90.0, 1e-30, -1e-30, 20.0, -20.0]  # ends of exp's range
    return mx.array(gate), mx.array(rng.normal(0.0, 1.0, (rows, WIDTH)).astype(np.float32))


@pytest.fixture(scope="module")
def model() -> object:
    model = tiny_family("llama", num_key_value_heads=2, num_attention_heads=4)
    assert install(model)
    assert host_swiglu.install(model)
    return model


def test_a_row_gets_the_same_bits_alone_and_among_300(model: object) -> None:
    gate, up = _values(300, seed=1)
    together = np.asarray(host_swiglu.swiglu(gate, up))
    for row in (0, 7, 150, 299):
        alone = np.asarray(host_swiglu.swiglu(gate[row : row + 1], up[row : row + 1]))
        assert np.array_equal(alone[0], together[row])


def test_it_is_swiglu(model: object) -> None:
    gate, up = _values(40, seed=2)
    ours = np.asarray(host_swiglu.swiglu(gate, up))
    theirs = np.asarray(mlx_swiglu(gate, up))
    assert np.all(np.isfinite(ours))
    assert np.allclose(ours, theirs, rtol=1e-5, atol=1e-30)


def test_rows_that_are_not_float32_keep_mlx_lm_s(model: object) -> None:
    gate, up = (a.astype(mx.bfloat16) for a in _values(4, seed=3))
    ours = host_swiglu.swiglu(gate, up)
    assert ours.dtype == mx.bfloat16
    assert mx.array_equal(ours, mlx_swiglu(gate, up)).item()


def test_installing_changes_the_call_and_keeps_the_mlps_modules(model: object) -> None:
    layer = model.model.layers[0]  # type: ignore[attr-defined]  # mlx-lm's model
    mlp = layer.mlp
    gate_proj, up_proj, down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
    assert isinstance(mlp, host_swiglu.HostSwigluMLP)
    assert host_swiglu.install(model)  # again: nothing changes
    assert layer.mlp is mlp
    assert (mlp.gate_proj, mlp.up_proj, mlp.down_proj) == (gate_proj, up_proj, down_proj)
    x = mx.array(np.random.default_rng(4).normal(size=(1, 50, gate_proj.weight.shape[1])))
    x = x.astype(mx.float32)
    expected = down_proj(host_swiglu.swiglu(gate_proj(x), up_proj(x)))
    assert mx.array_equal(mlp(x), expected).item()
