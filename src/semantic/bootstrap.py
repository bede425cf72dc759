"""The composition root: the one place that picks adapters and wires them to the rings.

The CLI, the HTTP server and the tests that need the real thing all build through here; unit
tests wire the application ring to fakes instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from semantic.adapters.mlx.backend import MlxBackend
from semantic.adapters.mlx.blas import report_blas
from semantic.adapters.mlx.gguf import WeightFormat
from semantic.adapters.mlx.kv_blocks import spec_from_model
from semantic.adapters.mlx.loader import LoadedModel, load_model, resolve_model
from semantic.adapters.mlx.model_cache import ModelCache, Progress, default_weight_format
from semantic.adapters.mlx.tokenizer import MlxTokenizer
from semantic.application.engine import BlockPoolBatchEngine, EngineConfig
from semantic.application.engine_loop import EngineLoop
from semantic.config import Settings
from semantic.domain.block_pool import BlockPool

log = logging.getLogger(__name__)


@dataclass
class EngineRuntime:
    settings: Settings
    loaded: LoadedModel
    tokenizer: MlxTokenizer
    backend: MlxBackend
    pool: BlockPool
    engine: BlockPoolBatchEngine
    loop: EngineLoop

    @property
    def model_id(self) -> str:
        return self.loaded.model_id

    def close(self) -> None:
        self.loop.stop()


def weight_format(settings: Settings) -> WeightFormat:
    if settings.weights == "auto":
        return default_weight_format()
    return WeightFormat(settings.weights)


def prepare_model(settings: Settings, progress: Progress) -> tuple[Path, str]:
    """Resolve ``settings.model`` to a local directory, fetching the embedded model if needed."""
    cache = ModelCache(settings.model_cache_dir)
    return resolve_model(settings.model, cache, weight_format(settings), progress)


def build_engine(settings: Settings, progress: Progress, *, warm_up: bool = True) -> EngineRuntime:
    """Load the model and start the engine thread; warm it up so the first request is fast."""
    report_blas()
    path, model_id = prepare_model(settings, progress)
    loaded = load_model(path, model_id)
    tokenizer = MlxTokenizer(loaded.tokenizer)
    spec = spec_from_model(loaded.model)
    backend = MlxBackend(
        loaded.model, spec, model_id, tokenizer.eos_token_ids, max_decoding=settings.max_running
    )
    pool = BlockPool.from_budget(spec, settings.kv_budget_bytes)
    config = EngineConfig(
        default_max_tokens=settings.default_max_tokens,
        max_context=int(loaded.config.get("max_position_embeddings") or 8192),
        prefill_chunk_tokens=settings.prefill_chunk_tokens,
        prefill_token_budget=settings.prefill_token_budget,
        max_running=settings.max_running,
    )
    engine = BlockPoolBatchEngine(backend, tokenizer, pool, config)
    loop = EngineLoop(engine)
    loop.start()
    if warm_up:
        loop.run_sync(backend.warm_up)
    log.info(
        "engine ready: %s, KV %d bytes/token, pool of %d blocks (%d MiB)",
        model_id, spec.bytes_per_token, pool.capacity, pool.capacity * spec.block_bytes >> 20,
    )  # fmt: skip
    return EngineRuntime(settings, loaded, tokenizer, backend, pool, engine, loop)
