"""A model whose layers keep state that is not KV by position (recurrent or hybrid layers)
cannot be cut into blocks: it is refused at start, naming the layer's cache kind, and never
served from wrong KV."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from mlx_lm.models.cache import ArraysCache, KVCache

from semantic.adapters.mlx.errors import UnsupportedModelError
from semantic.adapters.mlx.kv.kv_blocks import spec_from_model
from semantic.bootstrap import start_services
from tests.conformance.serving import settings_for
from tests.conformance.tiny_models import VOCAB, write_model_dir

pytestmark = pytest.mark.model  # the embedded model's tokenizer

MAMBA = {
    "model_type": "mamba",
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "state_size": 16,
    "num_hidden_layers": 2,
    "conv_kernel": 4,
    "use_bias": False,
    "use_conv_bias": True,
    "time_step_rank": 4,
}


def test_a_recurrent_model_is_refused_at_start_naming_its_cache(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    model = write_model_dir(MAMBA, tokenizer_dir, tmp_path / "mamba")
    settings = settings_for(model, tmp_path / "data")
    with pytest.raises(UnsupportedModelError, match="layer 0 uses mlx-lm's ArraysCache"):
        asyncio.run(start_services(settings, _quiet))


class _Hybrid:
    """What mlx-lm's hybrid models hand out: attention layers beside recurrent ones."""

    def make_cache(self) -> list[Any]:
        return [KVCache(), ArraysCache(2), KVCache()]  # type: ignore[no-untyped-call]  # mlx-lm: unannotated


def test_a_hybrid_model_is_refused_naming_the_first_layer_that_is_not_attention() -> None:
    with pytest.raises(UnsupportedModelError, match="layer 1 uses mlx-lm's ArraysCache"):
        spec_from_model(_Hybrid())


def _quiet(stage: str, done: int, total: int) -> None:
    pass
