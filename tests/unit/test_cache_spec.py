from __future__ import annotations

import pytest

from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.errors import InvalidRequestError


def smollm2() -> ModelCacheSpec:
    return ModelCacheSpec(30, 3, 64, 64, "float32", (None,) * 30)


def test_smollm2_costs_46080_bytes_per_token_in_float32() -> None:
    assert smollm2().bytes_per_token == 46_080
    assert smollm2().kv_bytes(4096) == 188_743_680


def test_a_global_layer_needs_one_block_per_256_tokens() -> None:
    spec = smollm2()
    assert [spec.blocks_for_layer(0, n) for n in (0, 1, 256, 257, 512, 513)] == [0, 1, 1, 2, 2, 3]
    assert spec.blocks_for_tokens(257) == 60


def test_a_sliding_layer_is_capped_by_its_window() -> None:
    spec = ModelCacheSpec(2, 1, 8, 8, "float16", (512, None))
    held = [spec.blocks_for_layer(0, n) for n in range(1, 5000, 37)]
    assert max(held) <= 512 // 256 + 1
    assert spec.blocks_for_layer(1, 4999) == 20
    assert spec.first_block_needed(0, 1000) == (1000 - 512) // 256


@pytest.mark.parametrize("windows", [(None,) * 4, (512, None, 1024, None), (300,) * 4])
def test_a_sequences_blocks_are_its_layers_blocks_summed(windows: tuple[int | None, ...]) -> None:
    spec = ModelCacheSpec(4, 1, 8, 8, "float16", windows)
    for n in range(0, 3000, 61):
        assert spec.blocks_for_tokens(n) == sum(spec.blocks_for_layer(i, n) for i in range(4))
    assert spec.has_sliding_layers == (windows != (None,) * 4)


def test_the_tokens_a_budget_holds_plateau_where_every_layer_slides() -> None:
    spec = smollm2()
    assert spec.tokens_within(60, 8192) == 512  # 30 layers, a block each per 256 tokens
    assert spec.tokens_within(59, 8192) == 256
    assert spec.tokens_within(10_000, 4096) == 4096
    sliding = ModelCacheSpec(2, 1, 8, 8, "float16", (512, 512))
    assert sliding.tokens_within(sliding.blocks_for_tokens(600), 8192) == 8192


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kv_dtype": "int3"},
        {"layer_windows": (None,)},
        {"n_kv_heads": 0},
        {"layer_windows": (0, None)},
    ],
)
def test_nonsense_geometry_is_refused(kwargs: dict[str, object]) -> None:
    base: dict[str, object] = {
        "n_layers": 2,
        "n_kv_heads": 1,
        "k_head_dim": 4,
        "v_head_dim": 4,
        "kv_dtype": "float32",
        "layer_windows": (None, None),
    }
    with pytest.raises(InvalidRequestError):
        ModelCacheSpec(**{**base, **kwargs})  # type: ignore[arg-type]  # deliberately wrong values
