"""What a model directory's own parts can do to a start: arrays a module holds besides its
weights (a LongRoPE's frequencies) are computed on the loading thread, and a config or
chat template that cannot work is refused then, naming the directory, not met later as a
500 or an engine that cannot run."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from semantic.adapters.mlx.errors import CorruptModelError
from semantic.adapters.mlx.models.loader import load_model
from tests.conformance.tiny_models import FAMILIES, write_model_dir
from tests.integration.conftest import RealModel

pytestmark = pytest.mark.model

LONGROPE = {
    **FAMILIES["phi3"],
    "max_position_embeddings": 131_072,
    "original_max_position_embeddings": 4_096,
    "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [1.5] * 48},
}


def _on_another_thread(model: Any) -> str:
    """The model run as the engine runs it: on its own thread and stream."""
    said: list[str] = []

    def run() -> None:
        with mx.stream(mx.new_stream(mx.cpu)):
            try:
                mx.eval(model(mx.array([[1, 2, 3]])))
                said.append("ran")
            except RuntimeError as error:
                said.append(str(error))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return said[0]


def test_a_longrope_model_loaded_on_one_thread_runs_on_another(
    real_model: RealModel, tmp_path: Path
) -> None:
    directory = write_model_dir(LONGROPE, real_model.path, tmp_path / "phi3-long")
    loaded = load_model(directory, "phi3-long")
    assert _on_another_thread(loaded.model) == "ran"


def test_a_config_its_family_cannot_take_is_refused_naming_the_directory(
    real_model: RealModel, tmp_path: Path
) -> None:
    directory = write_model_dir(FAMILIES["llama"], real_model.path, tmp_path / "no-layers")
    config = json.loads((directory / "config.json").read_text())
    del config["num_hidden_layers"]
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CorruptModelError, match="num_hidden_layers") as refused:
        load_model(directory, "no-layers")
    assert str(directory) in str(refused.value)


def test_a_chat_template_that_does_not_compile_is_refused_at_load(
    real_model: RealModel, tmp_path: Path
) -> None:
    directory = write_model_dir(FAMILIES["llama"], real_model.path, tmp_path / "bad-template")
    settings_file = directory / "tokenizer_config.json"
    settings = json.loads(settings_file.read_text())
    settings["chat_template"] = "{% for m in messages %}{{ m.content }"
    settings_file.write_text(json.dumps(settings))
    with pytest.raises(CorruptModelError, match="does not compile: unexpected '}'"):
        load_model(directory, "bad-template")
