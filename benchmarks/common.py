"""Shared set-up for benchmark scripts: the real model, built like the server builds it."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

import benchmarks  # noqa: F401 - readies the process (OpenBLAS) before MLX loads
from benchmarks.machine import print_machine
from semantic.adapters.cli.progress import ProgressPrinter
from semantic.adapters.mlx.backend import MlxBackend
from semantic.adapters.mlx.cpu import accelerator_for
from semantic.adapters.mlx.cpu.blas import report_blas
from semantic.adapters.mlx.devices import use_device
from semantic.adapters.mlx.kv.kv_blocks import spec_from_model
from semantic.adapters.mlx.models.loader import LoadedModel, load_model
from semantic.adapters.mlx.tokenizer.tokenizer import MlxTokenizer
from semantic.application.engine.batch_engine import BlockPoolBatchEngine, EngineConfig
from semantic.bootstrap import freeze_startup_objects, prepare_model
from semantic.config import Settings
from semantic.domain.block_pool import BlockPool
from semantic.domain.cache_spec import ModelCacheSpec

T = TypeVar("T")


@dataclass(frozen=True)
class Bench:
    loaded: LoadedModel
    tokenizer: MlxTokenizer
    spec: ModelCacheSpec

    def backend(self) -> MlxBackend:
        """A backend on the loaded model, to measure (or warm up) by itself."""
        return MlxBackend(
            self.loaded.model,
            self.spec,
            self.loaded.model_id,
            self.tokenizer.eos_token_ids,
            accelerator=accelerator_for(self.loaded.model),
        )

    def engine(self, budget_bytes: int = 4 << 30, **config: Any) -> BlockPoolBatchEngine:
        pool = BlockPool.from_budget(self.spec, budget_bytes)
        return BlockPoolBatchEngine(self.backend(), self.tokenizer, pool, EngineConfig(**config))


def load_bench(settings: Settings | None = None) -> Bench:
    report_blas()
    print_machine()
    settings = settings or Settings()
    print(f"device: {use_device(settings.device)}")
    return open_bench(settings)


def open_bench(settings: Settings) -> Bench:
    """The model ``settings`` name, loaded as the server loads it (no machine line)."""
    path, model_id = prepare_model(settings, ProgressPrinter())
    loaded = load_model(path, model_id)
    bench = Bench(loaded, MlxTokenizer(loaded.tokenizer), spec_from_model(loaded.model))
    freeze_startup_objects()  # as the server does: no full collection over the model mid-run
    return bench


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile, ignoring NaNs; NaN if nothing is left."""
    ordered = sorted(v for v in values if not math.isnan(v))
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def chat_chunks(
    client: httpx.Client, url: str, body: dict[str, Any], namespace: str
) -> Iterator[dict[str, Any]]:
    """The parsed SSE chunks of one streaming chat completion, as they arrive. Make the
    client before starting a clock: making one costs ~25 ms of TLS set-up, not server time."""
    with client.stream(
        "POST",
        f"{url}/v1/chat/completions",
        json={**body, "stream": True},
        timeout=900,
        headers={"X-Namespace": namespace},
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunk: dict[str, Any] = json.loads(line[6:])
                yield chunk


def content_of(chunk: dict[str, Any]) -> str:
    return "".join(c.get("delta", {}).get("content") or "" for c in chunk.get("choices", []))
