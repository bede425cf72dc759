"""The real embedded model, loaded once per test run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

from semantic.adapters.cli.progress import ProgressPrinter
from semantic.adapters.mlx.backend import MlxBackend
from semantic.adapters.mlx.cpu import accelerator_for
from semantic.adapters.mlx.kv.kv_blocks import spec_from_model
from semantic.adapters.mlx.kv.restore_buffers import RestoreBuffers
from semantic.adapters.mlx.models.loader import LoadedModel, load_model
from semantic.adapters.mlx.tokenizer.tokenizer import MlxTokenizer
from semantic.adapters.storage.sql_metadata import SqlMetadataStore
from semantic.application.engine.batch_engine import BlockPoolBatchEngine, EngineConfig
from semantic.bootstrap import grammar_compiler, prepare_model
from semantic.config import Settings
from semantic.domain.block_pool import BlockPool
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.ports.grammar import GrammarCompiler
from tests.redis_fixtures import redis_server, redis_url  # noqa: F401 - fixtures for the tests


@dataclass(frozen=True)
class RealModel:
    loaded: LoadedModel
    tokenizer: MlxTokenizer
    spec: ModelCacheSpec
    path: Path


EngineFactory = Callable[..., tuple[BlockPoolBatchEngine, MlxBackend]]
StoreFactory = Callable[[], SqlMetadataStore]


@pytest.fixture(params=["sqlite", "postgresql"])
def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """Metadata stores (not yet opened), each on the same database: a SQLite file in the
    test's directory, or a new database on the run's PostgreSQL server."""
    url = None
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres").create_database(f"t_{uuid4().hex[:16]}")
    return lambda: SqlMetadataStore(tmp_path / "semantic.db", url)


@pytest.fixture(scope="session")
def real_model(tmp_path_factory: pytest.TempPathFactory) -> RealModel:
    settings = Settings(data_dir=tmp_path_factory.mktemp("data"))
    path, model_id = prepare_model(settings, ProgressPrinter())
    loaded = load_model(path, model_id)
    return RealModel(loaded, MlxTokenizer(loaded.tokenizer), spec_from_model(loaded.model), path)


@pytest.fixture
def make_engine(real_model: RealModel) -> EngineFactory:
    """A fresh engine on the shared weights, stepped by the test on the test's own thread."""

    def build(
        budget_bytes: int = 1 << 30,
        buffers: RestoreBuffers | None = None,
        grammars: GrammarCompiler | None = None,
        forced_runs: bool = True,
        **config: Any,
    ) -> tuple[BlockPoolBatchEngine, MlxBackend]:
        eos, model = real_model.tokenizer.eos_token_ids, real_model.loaded.model
        accelerator = accelerator_for(model)
        backend = MlxBackend(
            model,
            real_model.spec,
            "test",
            eos,
            buffers,
            accelerator=accelerator,
            forced_runs=forced_runs,
        )
        pool = BlockPool.from_budget(real_model.spec, budget_bytes)
        engine = BlockPoolBatchEngine(
            backend, real_model.tokenizer, pool, EngineConfig(**config), grammars=grammars
        )
        return engine, backend

    return build


@pytest.fixture(scope="session")
def grammars(real_model: RealModel) -> GrammarCompiler:
    """The server's grammar engine over the embedded model's vocabulary, built once."""
    compiler = grammar_compiler(real_model.tokenizer)
    assert compiler is not None
    return compiler
