"""The embedded model's own 4-bit GGUF weights (``--weights quantized``) through the engine,
on our kernels (ADR 0031), beside the float32 copy the default serves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from benchmarks.corpus import conversation

from semantic.adapters.cli.progress import ProgressPrinter
from semantic.adapters.mlx.backend import MlxBackend
from semantic.adapters.mlx.cpu import accelerations_for, accelerator_for
from semantic.adapters.mlx.cpu.blas import blas_in_use
from semantic.adapters.mlx.cpu.llama_native import native_library
from semantic.adapters.mlx.kv.kv_blocks import spec_from_model
from semantic.adapters.mlx.models.loader import load_model
from semantic.adapters.mlx.tokenizer.tokenizer import MlxTokenizer
from semantic.application.engine.batch_engine import BlockPoolBatchEngine, EngineConfig
from semantic.bootstrap import prepare_model
from semantic.config import Settings
from semantic.domain.block_pool import BlockPool
from tests.helpers import generate
from tests.integration.conftest import RealModel

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(native_library() is None, reason="no host kernels here"),
]


@dataclass(frozen=True)
class Served:
    model: Any
    tokenizer: MlxTokenizer

    def engine(self) -> BlockPoolBatchEngine:
        spec = spec_from_model(self.model)
        eos = self.tokenizer.eos_token_ids
        accelerator = accelerator_for(self.model)
        backend = MlxBackend(self.model, spec, "test", eos, accelerator=accelerator)
        pool = BlockPool.from_budget(spec, 1 << 30)
        return BlockPoolBatchEngine(backend, self.tokenizer, pool, EngineConfig())


@pytest.fixture(scope="module")
def four_bit(tmp_path_factory: pytest.TempPathFactory) -> Served:
    settings = Settings(data_dir=tmp_path_factory.mktemp("data"), weights="quantized")
    path, model_id = prepare_model(settings, ProgressPrinter())
    loaded = load_model(path, model_id)
    return Served(loaded.model, MlxTokenizer(loaded.tokenizer))


def test_the_4_bit_model_runs_every_fast_path(four_bit: Served) -> None:
    said = {a.name: a.describe() for a in accelerations_for(four_bit.model, blas_in_use(), None)}
    assert said["bfloat16 and 4/8-bit products on our kernels (ADR 0031)"] == "on"
    assert said["host pass for small passes (ADR 0013)"] == "on"
    assert said["decode body beside the slice (ADR 0015)"] == "on"


@pytest.mark.parametrize(("seed", "history"), [(3, 40), (4, 600)])
def test_the_4_bit_model_answers_as_its_float32_copy_token_for_token(
    four_bit: Served, real_model: RealModel, seed: int, history: int
) -> None:
    """The float32 copy is the GGUF dequantized by ``mx.dequantize``; our products compute
    what it computes, in decode steps and in prompt chunks alike."""
    tokenizer = real_model.tokenizer
    messages = conversation(seed, history, lambda m: len(tokenizer.render_chat(m)))
    prompt = tokenizer.render_chat(messages)
    float32 = Served(real_model.loaded.model, tokenizer)
    ours = generate(four_bit.engine(), prompt, 24)
    theirs = generate(float32.engine(), prompt, 24)
    assert ours.token_ids == theirs.token_ids


def test_a_4_bit_agents_restored_blocks_continue_exactly_as_a_cold_prefill(
    four_bit: Served,
) -> None:
    tokenizer = four_bit.tokenizer
    messages = conversation(5, 500, lambda m: len(tokenizer.render_chat(m)))
    earlier, full = tokenizer.render_chat(messages[:-2]), tokenizer.render_chat(messages)
    engine = four_bit.engine()
    first = generate(engine, earlier, 4)
    assert first.blocks is not None
    warm = generate(engine, full, 24, cached_blocks=first.blocks)
    cold = generate(engine, full, 24)
    assert warm.stats.cached_tokens >= len(earlier) - 1
    assert warm.token_ids == cold.token_ids
