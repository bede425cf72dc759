"""Tiny models of every family, built once per run and kept in a temporary folder.

``SEMANTIC_TEST_DEVICE`` picks the MLX device the tests build and serve them on: ``cpu``
(the default), ``gpu`` or ``auto`` (MLX's default), in-process and in every ``semantic
serve`` the tests start. ``SEMANTIC_TEST_TOKENIZER`` names a folder holding the embedded
model's tokenizer files, for a machine that cannot fetch the embedded model.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import mlx.core as mx
import pytest

from semantic.adapters.cli.progress import ProgressPrinter
from semantic.adapters.mlx.devices import use_device
from semantic.bootstrap import prepare_model
from semantic.config import Settings
from tests.conformance.serving import device_choice
from tests.conformance.tiny_models import Variant, build_model_dir

TOKENIZER_ENV = "SEMANTIC_TEST_TOKENIZER"

ModelDirs = Callable[[Variant], Path]


@pytest.fixture(scope="session", autouse=True)
def mlx_device() -> Iterator[str]:
    """The device named by ``SEMANTIC_TEST_DEVICE``, MLX's default while the tests run."""
    before = mx.default_device()
    name = use_device(device_choice())
    yield name
    mx.set_default_device(before)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded model's directory: every tiny model reuses its tokenizer files."""
    if explicit := os.environ.get(TOKENIZER_ENV):
        return Path(explicit)
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
