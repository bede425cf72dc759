"""The composition root: the one place that picks adapters and wires them to the rings.

The CLI, the HTTP server and the tests that need the real thing all build through here; unit
tests wire the application ring to fakes instead.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from semantic.adapters.grammar.llguidance_grammar import LlguidanceCompiler
from semantic.adapters.mlx.backend import MlxBackend
from semantic.adapters.mlx.cpu import (
    accelerations_for,
    accelerator_for,
    kernel_name,
    prefault_heap,
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
from semantic.adapters.mlx.kv.host_codec import MlxHostCodec, check_at_rest, storage_format
from semantic.adapters.mlx.kv.kv_blocks import spec_from_model
from semantic.adapters.mlx.kv.restore_buffers import RestoreBuffers
from semantic.adapters.mlx.models.fingerprint import model_fingerprint
from semantic.adapters.mlx.models.gguf import WeightFormat
from semantic.adapters.mlx.models.loader import LoadedModel, load_model, resolve_model
from semantic.adapters.mlx.models.model_cache import ModelCache, Progress, default_weight_format
from semantic.adapters.mlx.tokenizer.tokenizer import MlxTokenizer
from semantic.adapters.storage.block_files import BlockFiles
from semantic.adapters.storage.data_dir_lock import acquire_data_directory, release_data_directory
from semantic.adapters.storage.kv_block_store import KVBlockStore
from semantic.adapters.storage.redis_blocks import RedisSharedBlocks
from semantic.adapters.storage.sql_leases import SqlLeases
from semantic.adapters.storage.sql_metadata import SqlMetadataStore
from semantic.adapters.storage.sqlite_objects import SqliteObjectStore
from semantic.application.agents.leases import AgentLeases, LeaseConfig, instance_holder
from semantic.application.agents.responses import ResponsesService
from semantic.application.agents.service import AgentService
from semantic.application.cache.store import AgentCacheStore, CacheConfig
from semantic.application.chat.call_memory import CallMemory
from semantic.application.chat.generation import GenerationService, Limits
from semantic.application.dashboard.turn_history import TurnHistory
from semantic.application.dashboard.view import Dashboard
from semantic.application.engine import BlockPoolBatchEngine, EngineConfig
from semantic.application.engine.engine_loop import EngineLoop
from semantic.application.observers import Observers
from semantic.application.scheduler.pacer import PacerConfig
from semantic.application.threads import install_default_executor
from semantic.config import Settings
from semantic.domain.block_pool import BlockPool
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.chat import ChatMessage
from semantic.domain.quotas import NamespaceQuotas
from semantic.ports.observer import GenerationObserver

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


@dataclass
class Services:
    """Everything the HTTP server serves with (see ``adapters.http.state.Services``)."""

    model_id: str
    tokenizer: MlxTokenizer
    spec: ModelCacheSpec
    pool: BlockPool
    loop: EngineLoop
    cache: AgentCacheStore
    metadata: SqlMetadataStore
    generation: GenerationService
    agents: AgentService
    data_dir: Path
    """The held data directory (``data_dir_lock``), given back when the services stop."""
    dashboard: Dashboard
    """What the dashboard shows, read from the books above and the turn history."""
    calls: CallMemory
    """Generated tool calls, rendered again as written on their round trip (ADR 0018)."""
    responses: ResponsesService
    """The Responses API's chains and conversations on the agents (ADR 0020)."""
    runtime: dict[str, Any] = field(default_factory=dict)
    """What the model runs on (BLAS and its core, kernels), served by ``/v1/models/{id}``."""


def weight_format(settings: Settings) -> WeightFormat:
    if settings.weights == "auto":
        return default_weight_format()
    return WeightFormat(settings.weights)


def prepare_model(settings: Settings, progress: Progress) -> tuple[Path, str]:
    """Resolve ``settings.model`` to a local directory, fetching the embedded model if needed."""
    cache = ModelCache(settings.model_cache_dir)
    return resolve_model(settings.model, cache, weight_format(settings), progress)


def build_engine(settings: Settings, progress: Progress, *, warm_up: bool = True) -> EngineRuntime:
    """Load the model and start the engine thread, with no storage behind it."""
    loaded, tokenizer, spec = _load(settings, progress)
    pool = BlockPool.from_budget(spec, settings.kv_budget_bytes)
    backend, engine, loop = _engine(
        settings, loaded, tokenizer=tokenizer, spec=spec, pool=pool, cache=None
    )
    loop.start()
    if warm_up:
        loop.run_sync(backend.warm_up)
    return EngineRuntime(settings, loaded, tokenizer, spec, backend, pool, engine, loop)


def _prepare_memory(n_bytes: int, spec: ModelCacheSpec, restore_buffers: RestoreBuffers) -> None:
    """Touch ``n_bytes`` up front so the first restores after a restart do not page-fault:
    half as ready buffers for whole blocks read from disk, the rest freed to the heap for
    the caches the engine builds."""
    block_file_bytes = spec.bytes_per_token * spec.block_tokens
    made = restore_buffers.reserve(block_file_bytes, restore_buffers.max_bytes // block_file_bytes)
    prefault_heap(n_bytes - made * block_file_bytes)


def _warm_up_chat_template(tokenizer: MlxTokenizer) -> None:
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


async def start_services(
    settings: Settings, progress: Progress, observer: GenerationObserver | None = None
) -> Services:
    """Everything the server needs, warmed up; storage recovered after any crash. The data
    directory is held for this process until ``stop_services``."""
    data_dir = acquire_data_directory(settings.data_dir)
    # Not given back if starting fails: storage threads may already run, so the directory
    # stays held until this process exits (a retry in this process holds it again).
    return await _start_services(settings, progress, observer, data_dir)


async def _start_services(
    settings: Settings, progress: Progress, observer: GenerationObserver | None, data_dir: Path
) -> Services:
    """Storage, then the model, the cache, the engine warmed up, and the front doors."""
    # Workers that touch MLX (loading, block writes) must be gone before the process ends.
    install_default_executor(asyncio.get_running_loop())
    # First: a database out of reach is said in a second, not after the model has loaded.
    metadata = SqlMetadataStore(settings.data_dir / "semantic.db", settings.database_url)
    await metadata.open()
    leases = _leases(settings, metadata)
    loaded, tokenizer, spec, kernel, fingerprint = await _model(settings, progress)
    pool = BlockPool.from_budget(spec, settings.kv_budget_bytes)
    prefault = min(settings.prefault_bytes, settings.kv_budget_bytes)
    host = host_memory()  # the device is chosen: may numpy view the KV where it lies?
    restore_buffers = _restore_buffers(settings, host, prefault)
    cache = _cache_store(
        settings,
        pool,
        fingerprint,
        spec=spec,
        metadata=metadata,
        restore_buffers=restore_buffers,
        leases=leases,
        host=host,
    )
    await cache.start()
    backend, _, loop = _engine(
        settings,
        loaded,
        tokenizer=tokenizer,
        spec=spec,
        pool=pool,
        cache=cache,
        buffers=restore_buffers if restore_buffers.max_bytes else None,  # else nothing reused
        host=host,
    )
    loop.start()
    await asyncio.to_thread(loop.run_sync, backend.warm_up)
    await asyncio.to_thread(_prepare_memory, prefault, spec, restore_buffers)
    _warm_up_chat_template(tokenizer)
    freeze_startup_objects()
    return await _services(
        settings,
        _Started(loaded, kernel, tokenizer, spec, pool, loop, host),
        cache,
        metadata=metadata,
        leases=leases,
        observer=observer,
        data_dir=data_dir,
    )


def _quotas(settings: Settings, spec: ModelCacheSpec) -> NamespaceQuotas:
    """``--namespace-quotas``: each limit at least one block of this model, else the server
    does not start, naming the field."""
    path = settings.namespace_quotas_file
    if path is None:
        return NamespaceQuotas()
    return NamespaceQuotas.parse(path.read_text(), smallest=spec.block_bytes * spec.n_layers)


def _restore_buffers(settings: Settings, host: HostMemory, prefault: int) -> RestoreBuffers:
    """Memory restores reuse, where numpy views the KV where it lies: quantized blocks are
    decoded, not viewed, and device memory is never viewed (then none is kept)."""
    viewed = settings.kv_at_rest == "lossless" and host.addressable
    return RestoreBuffers(max_bytes=prefault // 2 if viewed else 0)


async def _model(
    settings: Settings, progress: Progress
) -> tuple[LoadedModel, MlxTokenizer, ModelCacheSpec, str, str]:
    """The model loaded, its tokenizer and cache spec, its kernel and its fingerprint (the
    root of every block key, ADR 0005)."""
    loaded, tokenizer, spec = await asyncio.to_thread(_load, settings, progress)
    check_at_rest(settings.kv_at_rest, spec)
    kernel = _kernel_name(loaded)
    storage = storage_format(settings.kv_at_rest)
    fingerprint = await asyncio.to_thread(model_fingerprint, loaded.path, spec, storage, kernel)
    return loaded, tokenizer, spec, kernel, fingerprint


@dataclass(frozen=True)
class _Started:
    """The model and the running engine, as the front doors are built on them."""

    loaded: LoadedModel
    kernel: str
    tokenizer: MlxTokenizer
    spec: ModelCacheSpec
    pool: BlockPool
    loop: EngineLoop
    host: HostMemory


async def _services(
    settings: Settings,
    engine: _Started,
    cache: AgentCacheStore,
    *,
    metadata: SqlMetadataStore,
    leases: AgentLeases | None,
    observer: GenerationObserver | None,
    data_dir: Path,
) -> Services:
    """The services the HTTP server serves with, on a started engine."""
    loaded = engine.loaded
    limits = Limits(
        _max_context(loaded, settings), settings.max_tokens_cap, settings.default_max_tokens
    )
    history = TurnHistory()
    heard = history if observer is None else Observers(observer, history)
    generation = GenerationService(engine.loop, cache, limits, heard)
    agents = AgentService(generation, metadata, cache, engine.tokenizer, leases)
    responses = await _responses(agents, metadata, sweep=leases is None)
    _log_serving(settings, loaded, engine.spec, engine.pool)
    return Services(
        loaded.model_id,
        engine.tokenizer,
        engine.spec,
        engine.pool,
        engine.loop,
        cache,
        metadata,
        generation,
        agents,
        data_dir,
        dashboard=Dashboard(metadata, cache.hot, history, engine.spec.block_bytes),
        calls=CallMemory(metadata),
        responses=responses,
        runtime=_runtime(loaded, engine.kernel, engine.host) | _placement(settings),
    )


def _leases(settings: Settings, metadata: SqlMetadataStore) -> AgentLeases | None:
    """Each agent's lease in the database, when instances may share it: asked for, or a
    database by URL (ADR 0025). Off for SQLite in the data directory: its lock makes this
    process the database's only writer."""
    if not (settings.leases or settings.database_url):
        return None
    config = LeaseConfig(settings.lease_seconds, settings.lease_wait_s)
    leases = AgentLeases(SqlLeases(metadata.engine), instance_holder(), config)
    log.info("agents' leases on, as %s (%.0f s each)", leases.holder, config.seconds)
    return leases


async def _responses(
    agents: AgentService, metadata: SqlMetadataStore, *, sweep: bool
) -> ResponsesService:
    """The Responses API's store, swept of what a crash left (``collect_orphans``) where
    this process is the database's only user: with instances sharing it (leases on), a
    response another one is running would look orphaned, so nothing is swept."""
    objects = SqliteObjectStore(metadata)
    responses = ResponsesService(agents, objects)
    if sweep and (orphans := await responses.collect_orphans()):
        log.info("deleted %d response agents no stored response points at", orphans)
    await objects.warm_up()
    return responses


def _kernel_name(loaded: LoadedModel) -> str:
    """The kernels that computed the KV, for the fingerprint: KV from other kernels (or
    another device) differs in its last bits and is never mixed with this one's."""
    kernel = kernel_name(loaded.model, loaded.host_attention)
    if not on_cpu():
        kernel = f"{device_name()}+{kernel}"
    return kernel


def _cache_store(
    settings: Settings,
    pool: BlockPool,
    fingerprint: str,
    *,
    spec: ModelCacheSpec,
    metadata: SqlMetadataStore,
    restore_buffers: RestoreBuffers,
    leases: AgentLeases | None,
    host: HostMemory,
) -> AgentCacheStore:
    blocks = KVBlockStore(
        BlockFiles(settings.data_dir / "blocks"),
        MlxHostCodec(settings.kv_at_rest, restore_buffers, host),
    )
    config = CacheConfig(
        disk_quota_bytes=settings.disk_quota_bytes,
        disk_reserve_bytes=settings.disk_reserve_bytes,
        eviction=settings.eviction,
        quotas=_quotas(settings, spec),
    )
    shared = (
        None
        if settings.shared_blocks_url is None
        else RedisSharedBlocks(settings.shared_blocks_url)
    )
    return AgentCacheStore(
        pool,
        spec,
        fingerprint,
        block_store=blocks,
        metadata=metadata,
        config=config,
        lease_of=leases.held if leases is not None else None,
        shared=shared,
    )


def _log_serving(
    settings: Settings, loaded: LoadedModel, spec: ModelCacheSpec, pool: BlockPool
) -> None:
    log.info(
        "serving %s: KV %d bytes/token, pool of %d blocks (%d MiB), data in %s",
        loaded.model_id,
        spec.bytes_per_token,
        pool.capacity,
        pool.capacity * spec.block_bytes >> 20,
        settings.data_dir,
    )


def _placement(settings: Settings) -> dict[str, str]:
    """Which instance this is (behind a router, the one that answered) and where its
    metadata lives, as the dashboard shows them."""
    shared = settings.database_url is not None
    return {
        "instance": f"{socket.gethostname()}:{settings.port} (pid {os.getpid()})",
        "database": "shared by its instances" if shared else "this instance's (SQLite)",
    }


def _runtime(loaded: LoadedModel, kernel: str, host: HostMemory) -> dict[str, Any]:
    """What the model runs on, logged once and served by ``/v1/models/{id}``."""
    blas = preload_fast_blas()
    found = accelerations_for(loaded.model, blas)
    for acceleration in found:
        log.info("acceleration %s: %s", acceleration.name, acceleration.describe())
    log.info("kv restore and export: %s", host.describe())
    return {
        "device": device_name(),
        "kv_memory": host.describe(),
        "blas": blas.describe(),
        "kernels": kernel,
        "accelerations": {a.name: a.describe() for a in found},
    }


async def stop_services(services: Services, grace_s: float) -> None:
    """Finish or cancel running requests, flush every pending save, close storage."""
    await asyncio.to_thread(services.loop.drain, grace_s)
    await services.cache.close()
    services.loop.stop()
    await services.metadata.close()
    release_data_directory(services.data_dir)  # only after a clean close: nothing runs now


def _load(
    settings: Settings, progress: Progress
) -> tuple[LoadedModel, MlxTokenizer, ModelCacheSpec]:
    report_blas()
    log.info("device: %s", use_device(settings.device))
    path, model_id = prepare_model(settings, progress)
    loaded = load_model(path, model_id)
    tokenizer = MlxTokenizer(loaded.tokenizer, _max_context(loaded, settings))
    return loaded, tokenizer, spec_from_model(loaded.model)


def _engine(
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
        max_context=_max_context(loaded, settings),
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


def _max_context(loaded: LoadedModel, settings: Settings) -> int:
    """The model's window, or ``--max-context`` where that is smaller."""
    window = int(loaded.config.get("max_position_embeddings") or 8192)
    return window if settings.max_context is None else min(window, settings.max_context)
