"""Tiny models of every family, built once per run and kept in a temporary folder.

``SEMANTIC_TEST_DEVICE`` picks where the in-process tests build and run them: ``cpu`` (the
default) or ``gpu``. A server started as its own process uses MLX's default device.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import mlx.core as mx
import pytest

from semantic.adapters.cli.progress import ProgressPrinter
from semantic.bootstrap import prepare_model
from semantic.config import Settings
from tests.conformance.tiny_models import Variant, build_model_dir

DEVICE_ENV = "SEMANTIC_TEST_DEVICE"

ModelDirs = Callable[[Variant], Path]


@pytest.fixture(scope="session", autouse=True)
def test_device() -> Iterator[None]:
    name = os.environ.get(DEVICE_ENV, "cpu")
    if name not in ("cpu", "gpu"):
        raise pytest.UsageError(f"{DEVICE_ENV} must be cpu or gpu, not {name!r}")
    before = mx.default_device()
    device = mx.gpu if name == "gpu" else mx.cpu
    mx.set_default_device(device)
    yield
    mx.set_default_device(before)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded model's directory: every tiny model reuses its tokenizer files."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("unused-data"))
    path, _ = prepare_model(settings, ProgressPrinter())
    return path


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> ModelDirs:
    """The directory of a variant's model, built on first use."""
    root = tmp_path_factory.mktemp("tiny-models")
    built: dict[Variant, Path] = {}

    def get(variant: Variant) -> Path:
        if variant not in built:
            built[variant] = build_model_dir(variant, tokenizer_dir, root / variant.name)
        return built[variant]

    return get
