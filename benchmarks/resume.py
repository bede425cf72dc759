"""Resume: time to first token for a returning conversation, ours and mlx-lm's, same run.

For each history length: (a) cold, full prefill; (b) the same prompt again, KV in memory;
(c) the same prompt after a restart, KV from disk; (d) the realistic next turn (history +
the previous reply + a new ~20-token question) after a restart. Ours is measured through
HTTP with a streaming client; mlx-lm's through its own prompt-cache files
(``save_prompt_cache`` / ``load_prompt_cache``) on the same weights, in process; with
``with_llama``, llama.cpp's state files on the GGUF the weights came from.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any, TypeVar

import httpx
import mlx.core as mx
from mlx_lm import load as mlx_lm_load
from mlx_lm.models.cache import load_prompt_cache, make_prompt_cache, save_prompt_cache

from benchmarks import gguf_files, llama_cpp
from benchmarks.common import chat_chunks, content_of
from benchmarks.corpus import conversation
from benchmarks.servers import steady_server

QUESTION = "Thanks. In one sentence, what is the most important point so far?"
RESTARTS = 3
"""Each figure after a restart is the median of this many restarts (and mlx-lm's of as
many loads): one sample of ~200 ms moved by ~10% from run to run on this VM."""

Ttft = tuple[float, str, int]
T = TypeVar("T")


@dataclass
class ResumeRow:
    history: int
    ours_cold: float
    ours_memory: float
    ours_disk: float
    ours_next_turn: float
    ours_next_turn_cached: int
    next_turn_new_tokens: int
    mlx_cold: float
    mlx_same_prompt: float
    mlx_next_turn: float
    llama_cold: float | None = None
    llama_same_prompt: float | None = None
    llama_next_turn: float | None = None


def stream_ttft(
    url: str, messages: list[dict[str, str]], namespace: str, client: httpx.Client | None = None
) -> tuple[float, str, int]:
    """Seconds to the first streamed token, the reply text, and the cached prompt tokens."""
    client = client or httpx.Client()
    body = {
        "model": "default",
        "messages": messages,
        "temperature": 0,
        "max_tokens": 16,
        "stream_options": {"include_usage": True},
    }
    started, first, text, cached = time.perf_counter(), 0.0, "", 0
    for chunk in chat_chunks(client, url, body, namespace):
        if chunk.get("usage"):
            cached = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
        if content := content_of(chunk):
            first = first or time.perf_counter()
            text += content
    return first - started, text, cached


def after_restarts(work: Path, measure: Callable[[str], dict[int, Ttft]]) -> list[dict[int, Ttft]]:
    """``measure(url)`` on a server restarted on a fresh copy of ``work / "data"``,
    ``RESTARTS`` times (``on_a_fresh_copy``)."""
    return [on_a_fresh_copy(work, index, measure) for index in range(RESTARTS)]


def on_a_fresh_copy(
    work: Path, index: int, measure: Callable[[str], T], server_args: Sequence[str] = ()
) -> T:
    """``measure(url)`` on a server (started with ``server_args``) on a fresh copy of
    ``work / "data"`` as the earlier servers left it: a turn saves its blocks, so a second
    turn on the same directory would find more of its prompt stored than the first did."""
    data = work / f"restart-{index}"
    shutil.copytree(work / "data", data, ignore=shutil.ignore_patterns("lock", "*.log"))
    try:
        with steady_server(data, *server_args).start() as server:
            measured = measure(server.url)
            server.stop()
    finally:
        shutil.rmtree(data)
    return measured


def middle(runs: Iterable[Ttft]) -> Ttft:
    """The run with the median time to first token (an odd number of runs)."""
    ordered = sorted(runs, key=lambda run: run[0])
    return ordered[len(ordered) // 2]


class MlxLmPromptCache:
    """mlx-lm's own way to resume: a prompt cache file per conversation."""

    def __init__(self, model_path: Path, workdir: Path) -> None:
        loaded = mlx_lm_load(str(model_path))
        self.model = loaded[0]
        self.tokenizer: Any = loaded[1]  # mlx-lm's TokenizerWrapper is unannotated
        self.workdir = workdir

    def tokens(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prefill(self, cache: list[Any], tokens: Sequence[int], step: int = 2048) -> mx.array:
        logits: mx.array | None = None
        for start in range(0, len(tokens), step):
            logits = self.model(mx.array([list(tokens[start : start + step])]), cache=cache)
            mx.eval(logits, [c.state for c in cache])
        assert logits is not None
        return logits

    def cold(self, prompt: list[int]) -> float:
        """The whole prompt in one forward pass: mlx-lm's single-call prefill."""
        cache = make_prompt_cache(self.model)
        started = time.perf_counter()
        mx.eval(mx.argmax(self.prefill(cache, prompt, step=len(prompt))[:, -1], axis=-1))
        return time.perf_counter() - started

    def save(self, name: str, tokens: list[int]) -> Path:
        cache = make_prompt_cache(self.model)
        self.prefill(cache, tokens)
        path = self.workdir / f"{name}.safetensors"
        save_prompt_cache(str(path), cache)
        return path

    def resume(self, path: Path, suffix: list[int]) -> float:
        started = time.perf_counter()
        cache = load_prompt_cache(str(path))  # type: ignore[no-untyped-call]  # mlx-lm leaves it unannotated
        mx.eval(mx.argmax(self.prefill(cache, suffix)[:, -1], axis=-1))
        return time.perf_counter() - started


def run(
    sizes: Sequence[int], model_path: Path, token_count: Any, *, with_llama: bool = False
) -> list[ResumeRow]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        histories = {
            n: [
                {"role": m.role, "content": m.content}
                for m in conversation(100 + n, n, token_count)
            ]
            for n in sizes
        }
        cold, memory, replies = {}, {}, {}
        with steady_server(work / "data").start() as server:
            for n, history in histories.items():
                cold[n], replies[n], _ = stream_ttft(server.url, history, f"n{n}")
                memory[n], _, _ = stream_ttft(server.url, history, f"n{n}")
            server.stop()
        same = after_restarts(
            work, lambda url: {n: stream_ttft(url, h, f"n{n}") for n, h in histories.items()}
        )
        disk = {n: middle(run[n] for run in same)[0] for n in sizes}
        nexts: dict[int, list[dict[str, str]]] = {
            n: [
                *h,
                {"role": "assistant", "content": replies[n]},
                {"role": "user", "content": QUESTION},
            ]
            for n, h in histories.items()
        }
        turns = after_restarts(
            work, lambda url: {n: stream_ttft(url, nexts[n], f"n{n}") for n in sizes}
        )
        turn = {n: middle(run[n] for run in turns) for n in sizes}
        mlx = MlxLmPromptCache(model_path, work)
        llama = (
            llama_cpp.LlamaCppState(gguf_files.embedded_gguf(work), max(sizes) + 512, work)
            if with_llama
            else None
        )
        rows = []
        for n in sizes:
            prompt = mlx.tokens(histories[n])
            saved = mlx.save(f"same-{n}", prompt[:-1])
            reply_tokens = mlx.tokenizer.encode(replies[n], add_special_tokens=False)
            kept = [*prompt, *reply_tokens]
            after = mlx.save(f"turn-{n}", kept)
            next_prompt = mlx.tokens(nexts[n])
            shared = next(
                i for i, (a, b) in enumerate(zip([*kept, -1], next_prompt, strict=False)) if a != b
            )
            row = ResumeRow(
                history=len(prompt),
                ours_cold=cold[n],
                ours_memory=memory[n],
                ours_disk=disk[n],
                ours_next_turn=turn[n][0],
                ours_next_turn_cached=turn[n][2],
                next_turn_new_tokens=len(next_prompt) - shared,
                mlx_cold=mlx.cold(prompt),
                mlx_same_prompt=median(mlx.resume(saved, prompt[-1:]) for _ in range(RESTARTS)),
                mlx_next_turn=median(
                    mlx.resume(after, next_prompt[shared:]) for _ in range(RESTARTS)
                ),
            )
            if llama is not None:
                row.llama_cold = llama.cold(prompt)
                row.llama_same_prompt = llama.resume(
                    llama.save(f"same-{n}", prompt[:-1]), prompt[-1:]
                )
                row.llama_next_turn = llama.resume(
                    llama.save(f"turn-{n}", kept), next_prompt[shared:]
                )
            rows.append(row)
        return rows
