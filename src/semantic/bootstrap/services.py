"""Storage, the cache and the services the front doors serve with, on a started engine."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from semantic.adapters.http.keys import key_quotas
from semantic.adapters.mlx.cpu import PagePlacement
from semantic.adapters.mlx.devices import (
    HostMemory,
    host_memory,
)
from semantic.adapters.mlx.kv.host_codec import MlxHostCodec
from semantic.adapters.mlx.kv.restore_buffers import RestoreBuffers
from semantic.adapters.mlx.models.loader import LoadedModel
from semantic.adapters.mlx.models.model_cache import Progress
from semantic.adapters.mlx.tokenizer.tokenizer import MlxTokenizer
from semantic.adapters.storage.block_files import BlockFiles
from semantic.adapters.storage.data_dir_lock import acquire_data_directory, release_data_directory
from semantic.adapters.storage.kv_block_store import KVBlockStore
from semantic.adapters.storage.redis_blocks import RedisSharedBlocks
from semantic.adapters.storage.sql_leases import SqlLeases
from semantic.adapters.storage.sql_metadata import DatabaseProbe, SqlMetadataStore
from semantic.adapters.storage.sqlite_objects import SqliteObjectStore
from semantic.application.agents.leases import AgentLeases, LeaseConfig, instance_holder
from semantic.application.agents.responses import ResponsesService
from semantic.application.agents.service import AgentService
from semantic.application.cache.store import AgentCacheStore, CacheConfig
from semantic.application.chat.call_memory import CallMemory
from semantic.application.chat.chat_turn import ChatTurns
from semantic.application.chat.generation import GenerationService, Limits
from semantic.application.chat.message_threads import MessageThreads
from semantic.application.dashboard.turn_history import TurnHistory
from semantic.application.dashboard.view import Dashboard
from semantic.application.engine.engine_loop import EngineLoop
from semantic.application.engine.events import StepResult
from semantic.application.observers import Observers
from semantic.application.readiness import ReadinessCheck
from semantic.application.threads import install_default_executor
from semantic.bootstrap.model import (
    engine_on,
    finish_start,
    load_for_serving,
    max_context,
    runtime_report,
)
from semantic.bootstrap.prefault import RESERVE_WAIT_S, prefault_work
from semantic.config import Settings
from semantic.domain.block_pool import BlockPool
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.errors import InvalidRequestError
from semantic.domain.quotas import MIB, NamespaceQuotas
from semantic.ports.observer import GenerationObserver

log = logging.getLogger(__name__)


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
    chats: ChatTurns
    """The plain front doors' chat turn (chat completions, completions, messages)."""
    readiness: ReadinessCheck
    """Whether turns can be taken now (``/ready``): the disk, the metadata database."""
    responses: ResponsesService
    """The Responses API's chains and conversations on the agents (ADR 0020)."""
    runtime: dict[str, Any] = field(default_factory=dict)
    """What the model runs on (BLAS and its core, kernels), served by ``/v1/models/{id}``."""
    beside: PagePlacement | None = None
    """The work beside the server once it answers (the prefault, the weights' move)."""

    @property
    def last_step(self) -> StepResult | None:
        return self.loop.last_step


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
    loaded, tokenizer, spec, kernel, fingerprint = await load_for_serving(settings, progress)
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
    backend, _, loop = engine_on(
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
    on_engine = functools.partial(loop.run_sync, timeout=RESERVE_WAIT_S)
    memory = prefault_work(prefault, spec, restore_buffers, on_engine, loop.idle)
    await asyncio.to_thread(finish_start, loaded, tokenizer, loop, memory)
    return await _services(
        settings,
        _Started(loaded, kernel, tokenizer, spec, pool, loop, host),
        cache,
        metadata=metadata,
        leases=leases,
        observer=observer,
        data_dir=data_dir,
    )


def _disk_quota(settings: Settings, spec: ModelCacheSpec) -> int | None:
    """``--disk-quota-mb``, at least one block of this model (a namespace's quota is held
    to that too): a quota that cannot hold one block would keep nothing on disk."""
    quota, smallest = settings.disk_quota_bytes, spec.block_bytes * spec.n_layers
    if quota is not None and quota < smallest:
        raise InvalidRequestError(
            f"--disk-quota-mb {quota / MIB:g} is less than one KV block of this model "
            f"({smallest / MIB:.1f} MiB)",
            param="disk_quota_mb",
        )
    return quota


def _quotas(settings: Settings, spec: ModelCacheSpec) -> NamespaceQuotas:
    """``--namespace-quotas`` and the keys file's quotas (``disk_mb=N`` on a key's line):
    each limit at least one block of this model, a namespace given one quota, else the
    server does not start, naming the field."""
    smallest = spec.block_bytes * spec.n_layers
    path, keys = settings.namespace_quotas_file, settings.api_keys_file
    filed = NamespaceQuotas() if path is None else NamespaceQuotas.parse(path.read_text(), smallest)
    if keys is None:
        return filed
    return filed.with_others(NamespaceQuotas.of_mapping(key_quotas(keys), smallest))


def _restore_buffers(settings: Settings, host: HostMemory, prefault: int) -> RestoreBuffers:
    """Memory restores reuse, where numpy views the KV where it lies: quantized blocks are
    decoded, not viewed, and device memory is never viewed (then none is kept)."""
    viewed = settings.kv_at_rest == "lossless" and host.addressable
    return RestoreBuffers(max_bytes=prefault // 2 if viewed else 0)


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


def _limits(settings: Settings, engine: _Started) -> Limits:
    """What a request is checked against (``request_validation``), from the started engine."""
    window = max_context(engine.loaded, settings)
    if settings.max_context is not None and settings.max_context > window:
        log.warning(
            "--max-context %d is over the model's window: serving its %d tokens",
            settings.max_context,
            window,
        )
    scored = engine.loaded.scored_tokens
    vocab = engine.tokenizer.vocab_size
    return Limits(
        window,
        settings.max_tokens_cap,
        settings.default_max_tokens,
        vocab_size=vocab if scored is None else min(vocab, scored),
        kv_tokens=engine.spec.tokens_within(engine.pool.capacity, window),
    )


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
    limits = _limits(settings, engine)
    history = TurnHistory()
    heard = history if observer is None else Observers(observer, history)
    generation = GenerationService(engine.loop, cache, limits, heard)
    agents = AgentService(
        generation,
        cache,
        engine.tokenizer,
        agent_records=metadata,
        block_records=metadata,
        transcripts=metadata,
        leases=leases,
    )
    objects = SqliteObjectStore(metadata)
    responses = await _responses(agents, objects, sweep=leases is None)
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
        dashboard=Dashboard(
            metadata, metadata, cache.hot, history, pool_block_bytes=engine.spec.block_bytes
        ),
        chats=ChatTurns(
            agents, engine.tokenizer, CallMemory(metadata), limits, MessageThreads(objects)
        ),
        readiness=ReadinessCheck(lambda: cache.disk, {"metadata": DatabaseProbe(metadata)}),
        responses=responses,
        runtime=runtime_report(loaded, engine.kernel, engine.host) | _placement(settings),
        beside=loaded.pages,
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
    agents: AgentService, objects: SqliteObjectStore, *, sweep: bool
) -> ResponsesService:
    """The Responses API's store, swept of what a crash left (``collect_orphans``) where
    this process is the database's only user: with instances sharing it (leases on), a
    response another one is running would look orphaned, so nothing is swept."""
    responses = ResponsesService(agents, objects)
    if sweep and (orphans := await responses.collect_orphans()):
        log.info("deleted %d response agents no stored response points at", orphans)
    await objects.warm_up()
    return responses


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
        disk_quota_bytes=_disk_quota(settings, spec),
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
        agent_records=metadata,
        block_records=metadata,
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


async def stop_services(services: Services, grace_s: float) -> None:
    """Finish or cancel running requests, flush every pending save, close storage."""
    if services.beside is not None:
        services.beside.stop()  # no more of the prefault or the move: memory is let go
    await asyncio.to_thread(services.loop.drain, grace_s)
    await services.cache.close()
    services.loop.stop()
    await services.metadata.close()
    release_data_directory(services.data_dir)  # only after a clean close: nothing runs now
