"""llama.cpp beside us: cold prefill and state-file resume on the same GGUF (full mode only).

llama.cpp runs the embedded model's own Q4_1 GGUF, the file our float32 MLX weights were
converted from, so the comparison is the same network at a different weight precision.
``llama-cpp-python`` is optional: where it does not install, the full mode says so and
leaves these columns out.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

N_THREADS = 2


def available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


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


def parallel_decode_rate(gguf: Path, streams: int, prompt: int = 32, steps: int = 32) -> float:
    """Tokens/s of ``streams`` sequences decoding together in one llama.cpp context (its
    batch API, one token of each sequence per ``llama_decode``), after a short prompt each."""
    import llama_cpp

    _quiet(llama_cpp)
    model = llama_cpp.llama_model_load_from_file(
        str(gguf).encode(), llama_cpp.llama_model_default_params()
    )
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = streams * (prompt + steps + 8)
    params.n_batch = params.n_ubatch = max(streams * prompt, 512)
    params.n_seq_max = streams
    params.n_threads = params.n_threads_batch = N_THREADS
    ctx = llama_cpp.llama_init_from_model(model, params)
    batch = llama_cpp.llama_batch_init(streams * prompt, 0, streams)
    try:
        cells = [(s, p, 100 + 7 * s + p) for s in range(streams) for p in range(prompt)]
        _decode(llama_cpp, ctx, batch, cells)
        started = time.perf_counter()
        for step in range(steps):
            _decode(llama_cpp, ctx, batch, [(s, prompt + step, 200 + s) for s in range(streams)])
        return streams * steps / (time.perf_counter() - started)
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)


def _decode(llama_cpp: Any, ctx: Any, batch: Any, cells: list[tuple[int, int, int]]) -> None:
    """One ``llama_decode`` of (sequence, position, token) cells, logits for each."""
    for i, (sequence, position, token) in enumerate(cells):
        batch.token[i], batch.pos[i] = token, position
        batch.n_seq_id[i], batch.logits[i] = 1, True
        batch.seq_id[i][0] = sequence
    batch.n_tokens = len(cells)
    if llama_cpp.llama_decode(ctx, batch) != 0:
        raise RuntimeError("llama_decode failed")


_SILENT: list[Any] = []
"""The no-op log callback, kept alive while llama.cpp may call it."""


def _quiet(llama_cpp: Any) -> None:
    """llama.cpp's loader logs every tensor to stderr unless given a callback."""
    if not _SILENT:
        _SILENT.append(llama_cpp.llama_log_callback(lambda *_: None))
        llama_cpp.llama_log_set(_SILENT[0], ctypes.c_void_p())
