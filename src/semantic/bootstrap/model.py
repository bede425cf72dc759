"""The model and the engine on it: loaded, warmed up, and what it runs on."""

from __future__ import annotations

import asyncio
import gc
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from semantic.adapters.grammar.llguidance_grammar import LlguidanceCompiler
from semantic.adapters.mlx.backend import MlxBackend
from semantic.adapters.mlx.cpu import (
    accelerations_for,
    accelerator_for,
    huge_pages_line,
    kernel_name,
    preload_fast_blas,
    report_blas,
)
from semantic.adapters.mlx.devices import (
    HostMemory,
    device_name,
    host_memory,
    on_cpu,
    use_device,
)
from semantic.adapters.mlx.kv.host_codec import check_at_rest, storage_format
from semantic.adapters.mlx.kv.kv_blocks import spec_from_model
from semantic.adapters.mlx.kv.restore_buffers import RestoreBuffers
from semantic.adapters.mlx.models.digest_memo import DigestMemo
from semantic.adapters.mlx.models.fingerprint import model_fingerprint
from semantic.adapters.mlx.models.gguf import WeightFormat
from semantic.adapters.mlx.models.loader import LoadedModel, load_model, resolve_model
from semantic.adapters.mlx.models.model_cache import ModelCache, Progress
from semantic.adapters.mlx.tokenizer.tokenizer import MlxTokenizer
from semantic.application.cache.store import AgentCacheStore
from semantic.application.engine.batch_engine import BlockPoolBatchEngine, EngineConfig
from semantic.application.engine.engine_loop import EngineLoop
from semantic.application.scheduler.pacer import PacerConfig
from semantic.bootstrap.prefault import MemoryWork
from semantic.config import Settings
from semantic.domain.block_pool import BlockPool
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.chat import ChatMessage

log = logging.getLogger(__name__)


@dataclass
class EngineRuntime:
    """The model and a running engine, without storage (``semantic generate``)."""

    settings: Settings
    loaded: LoadedModel
    tokenizer: MlxTokenizer
    spec: ModelCacheSpec
    backend: MlxBackend
    pool: BlockPool
    engine: BlockPoolBatchEngine
    loop: EngineLoop

    @property
    def model_id(self) -> str:
        return self.loaded.model_id

    def close(self) -> None:
        self.loop.stop()


def weight_format(settings: Settings) -> WeightFormat | None:
    """``--weights``; None for ``auto``, which each kind of model source resolves."""
    return None if settings.weights == "auto" else WeightFormat.named(settings.weights)


def prepare_model(settings: Settings, progress: Progress) -> tuple[Path, str]:
    """Resolve ``settings.model`` to a local directory, fetching the embedded model if needed."""
    cache = ModelCache(settings.model_cache_dir)
    return resolve_model(settings.model, cache, weight_format(settings), progress)


def build_engine(settings: Settings, progress: Progress, *, warm_up: bool = True) -> EngineRuntime:
    """Load the model and start the engine thread, with no storage behind it."""
    loaded, tokenizer, spec = load(settings, progress)
    pool = BlockPool.from_budget(spec, settings.kv_budget_bytes)
    backend, engine, loop = engine_on(
        settings, loaded, tokenizer=tokenizer, spec=spec, pool=pool, cache=None
    )
    loop.start()
    if warm_up:
        loop.run_sync(backend.warm_up)
    return EngineRuntime(settings, loaded, tokenizer, spec, backend, pool, engine, loop)


def finish_start(
    loaded: LoadedModel, tokenizer: MlxTokenizer, loop: EngineLoop, memory: MemoryWork
) -> None:
    """The last of a server's start, once the engine is warm: then ``memory`` (the
    prefault, ``prefault.prefault_work``) and the weights' move onto huge pages run one
    after the other on a thread of their own in the engine's idle time (ADR 0032; a page on
    the move locks the address space, so the faults go first). Where no move is to come,
    ``memory`` runs now, before the server answers, as it always did."""
    warm_up_chat_template(tokenizer)
    freeze_startup_objects()
    moving = loaded.pages is not None and loaded.pages.start(idle=loop.idle, before=memory)
    if not moving:
        memory(lambda: True)


def warm_up_chat_template(tokenizer: MlxTokenizer) -> None:
    """Compile the chat template now: its first render took ~6 ms of the first request. A
    template that cannot render this fails the requests that need it, not the start."""
    try:
        tokenizer.render_chat([ChatMessage("user", "Hello.")])
    except Exception as error:  # noqa: BLE001 - any template error; the server still serves
        log.warning("the chat template did not render a one-message chat: %s", error)


def freeze_startup_objects() -> None:
    """Move everything loaded so far (the model's modules, the tokenizer's vocabulary) out
    of the garbage collector's sight: a full collection over them stalled every thread for
    ~50 ms in the middle of the first restore after a restart."""
    gc.collect()
    gc.freeze()


async def load_for_serving(
    settings: Settings, progress: Progress
) -> tuple[LoadedModel, MlxTokenizer, ModelCacheSpec, str, str]:
    """The model loaded, its tokenizer and cache spec, its kernel and its fingerprint (the
    root of every block key, ADR 0005)."""
    loaded, tokenizer, spec = await asyncio.to_thread(load, settings, progress, True)
    check_at_rest(settings.kv_at_rest, spec)
    kernel = kernel_of(loaded)
    storage = storage_format(settings.kv_at_rest)
    memo = DigestMemo(settings.model_cache_dir / "digests")
    fingerprint = await asyncio.to_thread(
        model_fingerprint, loaded.path, spec, storage, kernel, memo
    )
    return loaded, tokenizer, spec, kernel, fingerprint


def kernel_of(loaded: LoadedModel) -> str:
    """The kernels that computed the KV, for the fingerprint: KV from other kernels (or
    another device) differs in its last bits and is never mixed with this one's."""
    kernel = kernel_name(loaded.model, loaded.host_attention)
    if not on_cpu():
        kernel = f"{device_name()}+{kernel}"
    return kernel


def runtime_report(loaded: LoadedModel, kernel: str, host: HostMemory) -> dict[str, Any]:
    """What the model runs on, logged once and served by ``/v1/models/{id}``; the huge pages'
    line is brought up to date when their move ends (it goes on beside the server)."""
    blas = preload_fast_blas()
    found = accelerations_for(loaded.model, blas, loaded.pages)
    for acceleration in found:
        log.info("acceleration %s: %s", acceleration.name, acceleration.describe())
    log.info("kv restore and export: %s", host.describe())
    lines = {a.name: a.describe() for a in found}
    if (placement := loaded.pages) is not None:
        placement.when_done(lambda _: _bring_up_to_date(lines, huge_pages_line(placement)))
    return {
        "device": device_name(),
        "kv_memory": host.describe(),
        "blas": blas.describe(),
        "kernels": kernel,
        "accelerations": lines,
    }


def _bring_up_to_date(lines: dict[str, str], line: tuple[str, str]) -> None:
    """Logged first, then served: whatever ``/v1/models/{id}`` says, the log said before."""
    if lines.get(line[0]) != line[1]:
        log.info("acceleration %s: %s", *line)
        lines[line[0]] = line[1]


def load(
    settings: Settings, progress: Progress, move_weights_later: bool = False
) -> tuple[LoadedModel, MlxTokenizer, ModelCacheSpec]:
    """``move_weights_later``: the caller starts the weights' move (``finish_start``)."""
    report_blas()
    log.info("device: %s", use_device(settings.device))
    path, model_id = prepare_model(settings, progress)
    loaded = load_model(path, model_id, move_weights_later=move_weights_later)
    tokenizer = MlxTokenizer(loaded.tokenizer, max_context(loaded, settings))
    return loaded, tokenizer, spec_from_model(loaded.model)


def engine_on(
    settings: Settings,
    loaded: LoadedModel,
    *,
    tokenizer: MlxTokenizer,
    spec: ModelCacheSpec,
    pool: BlockPool,
    cache: AgentCacheStore | None,
    buffers: RestoreBuffers | None = None,
    host: HostMemory | None = None,
) -> tuple[MlxBackend, BlockPoolBatchEngine, EngineLoop]:
    backend = MlxBackend(
        loaded.model,
        spec,
        loaded.model_id,
        tokenizer.eos_token_ids,
        buffers,
        accelerator=accelerator_for(loaded.model),
        host=host or host_memory(),
    )
    config = EngineConfig(
        default_max_tokens=settings.default_max_tokens,
        prefill_chunk_tokens=settings.prefill_chunk_tokens,
        pacer=pacer_config(settings),
        max_running=settings.max_running,
        max_waiting=settings.max_waiting,
    )
    reclaim = cache.reclaim if cache is not None else None
    engine = BlockPoolBatchEngine(
        backend, tokenizer, pool, config, reclaim=reclaim, grammars=grammar_compiler(tokenizer)
    )
    adopt = cache.adopt_completion if cache is not None else None
    return backend, engine, EngineLoop(engine, on_completion=adopt)


def grammar_compiler(tokenizer: MlxTokenizer) -> LlguidanceCompiler | None:
    """Constrained decoding over the model's own vocabulary (none for a tokenizer the
    grammar engine cannot read: constrained requests are then refused)."""
    tokenizer_json = tokenizer.tokenizers_json()
    if tokenizer_json is None:
        return None
    return LlguidanceCompiler(tokenizer_json, tokenizer.vocab_size, tokenizer.eos_token_ids)


def pacer_config(settings: Settings) -> PacerConfig:
    """The server's prefill pacing (benchmarks measure this very policy)."""
    return PacerConfig(
        fixed_tokens=settings.prefill_fixed_tokens,
        ride_ratio=settings.prefill_ride_ratio,
        slice_ratio=settings.prefill_slice_ratio,
        idle_slice_seconds=settings.prefill_idle_slice_s,
    )


def max_context(loaded: LoadedModel, settings: Settings) -> int:
    """The model's window, or ``--max-context`` where that is smaller."""
    window = int(loaded.config.get("max_position_embeddings") or 8192)
    return window if settings.max_context is None else min(window, settings.max_context)
