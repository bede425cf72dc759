"""Prometheus metrics: latency histograms fed per request, live gauges read at scrape."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from semantic.adapters.http.state import ServerState, Services
from semantic.application.cache.disk_room import DiskState
from semantic.application.cache.hot_index import CACHE_OWNER
from semantic.application.cache.stats import CacheStats
from semantic.domain.generation import FinishedRequest

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_GAPS = (0.01, 0.02, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2, 5)


class Metrics:
    """The ``GenerationObserver`` of the server, and the ``/metrics`` page."""

    def __init__(self, state: ServerState) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft, self.itl, self.e2e, self.queued = _latencies(r)
        self.tokens_in, self.tokens_out, self.tokens_cached = _token_counters(r)
        self.requests, self.cache_dropped, self.cache_dropped_tokens = _request_counters(r)
        self.abandoned, self.refused = _turned_away(r)
        self._live = _Live(state)
        r.register(self._live)

    def on_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def on_token_gap(self, seconds: float) -> None:
        self.itl.observe(seconds)

    def on_finished(self, finished: FinishedRequest) -> None:
        stats = finished.stats
        self.e2e.observe(finished.seconds)
        self.queued.observe(stats.queued_s)
        self.tokens_in.inc(finished.prompt_tokens)
        self.tokens_out.inc(stats.generated_tokens)
        self.tokens_cached.inc(stats.cached_tokens)
        self.requests.inc()
        if stats.dropped_tokens:
            self.cache_dropped.inc()
            self.cache_dropped_tokens.inc(stats.dropped_tokens)

    def on_abandoned(self) -> None:
        self.abandoned.inc()

    def on_refused(self, status: int, code: str) -> None:
        self.refused.labels(status=str(status), code=code).inc()

    def render(self, disk_by_namespace: Mapping[str, int] | None = None) -> bytes:
        """``disk_by_namespace``: read from the database by the route just before (a
        collector cannot wait for it); None leaves that gauge out."""
        self._live.disk_by_namespace = disk_by_namespace
        return generate_latest(self.registry)


def _latencies(r: CollectorRegistry) -> tuple[Histogram, Histogram, Histogram, Histogram]:
    """Time to first token, between tokens, of the whole request, and queued."""
    return (
        Histogram(
            "semantic_time_to_first_token_seconds",
            "Time from accepting a request to its first token.",
            buckets=_LATENCY,
            registry=r,
        ),
        Histogram(
            "semantic_inter_token_latency_seconds",
            "Time between consecutive tokens of one request.",
            buckets=_GAPS,
            registry=r,
        ),
        Histogram(
            "semantic_request_duration_seconds",
            "End-to-end time of a request.",
            buckets=_LATENCY,
            registry=r,
        ),
        Histogram(
            "semantic_queue_time_seconds",
            "Time a request waited before its prefill began.",
            buckets=_LATENCY,
            registry=r,
        ),
    )


def _token_counters(r: CollectorRegistry) -> tuple[Counter, Counter, Counter]:
    """Prompt tokens received, tokens generated, and prompt tokens not computed."""
    return (
        Counter("semantic_prompt_tokens", "Prompt tokens received.", registry=r),
        Counter("semantic_generation_tokens", "Tokens generated.", registry=r),
        Counter(
            "semantic_prompt_cached_tokens",
            "Prompt tokens of finished requests not computed for them, as usage reports them: "
            "restored from the cache or copied from a running request sharing the prefix.",
            registry=r,
        ),
    )


def _request_counters(r: CollectorRegistry) -> tuple[Counter, Counter, Counter]:
    """Requests finished, and those whose stored prefix could not be restored."""
    return (
        Counter("semantic_requests", "Requests finished.", registry=r),
        Counter(
            "semantic_prefix_cache_dropped",
            "Requests whose stored prefix could not be restored (a sliding window's "
            "positions missing, say), so it was dropped and the prompt computed.",
            registry=r,
        ),
        Counter(
            "semantic_prefix_cache_dropped_tokens",
            "Prompt tokens found in the prefix cache that could not be restored.",
            registry=r,
        ),
    )


def _turned_away(r: CollectorRegistry) -> tuple[Counter, Counter]:
    """Requests whose client left first, and those answered with an error status."""
    return (
        Counter(
            "semantic_requests_abandoned",
            "Requests cancelled because their client went away first.",
            registry=r,
        ),
        Counter(
            "semantic_requests_refused",
            "Requests answered with an error status, by status and error code.",
            labelnames=("status", "code"),
            registry=r,
        ),
    )


class _Live:
    """Values owned elsewhere (the engine, the pool, the cache), read when scraped."""

    def __init__(self, state: ServerState) -> None:
        self._state = state
        self.disk_by_namespace: Mapping[str, int] | None = None

    def collect(self) -> Iterator[Metric]:
        services = self._state.services
        if services is None:
            return
        yield from _engine(services)
        yield from _pool(services)
        yield from _cache(services.cache.stats)
        yield from _disk(services.cache.disk)
        yield from _namespaces(services, self.disk_by_namespace)
        yield from _shared_tier(services.cache.shared_state, services.cache.stats)


def _engine(services: Services) -> Iterator[Metric]:
    """Requests running and waiting at the engine's last step."""
    step = services.last_step
    running = (step.decoding + step.prefilling) if step else 0
    yield GaugeMetricFamily(
        "semantic_requests_running", "Requests prefilling or decoding.", value=running
    )
    yield GaugeMetricFamily(
        "semantic_requests_waiting",
        "Requests queued for admission.",
        value=step.waiting if step else 0,
    )


def _pool(services: Services) -> Iterator[Metric]:
    """The KV pool's use, and the cache's share of it."""
    usage = services.pool.usage()
    block_bytes = services.cache.block_bytes
    yield GaugeMetricFamily(
        "semantic_kv_pool_used_blocks", "KV pool blocks in use.", value=usage.used
    )
    yield GaugeMetricFamily(
        "semantic_kv_pool_capacity_blocks", "KV pool size in blocks.", value=usage.capacity
    )
    yield GaugeMetricFamily(
        "semantic_kv_cache_blocks",
        "KV pool blocks the prefix cache holds (the rest belong to running requests).",
        value=len(services.pool.held_by(CACHE_OWNER)),
    )
    yield GaugeMetricFamily(
        "semantic_kv_pool_used_bytes", "KV pool bytes in use.", value=usage.used * block_bytes
    )


def _cache(stats: CacheStats) -> Iterator[Metric]:
    """The prefix cache's lookups, restores and block files, since the server started."""
    yield CounterMetricFamily(
        "semantic_prefix_cache_queried_tokens",
        "Prompt tokens looked up in the prefix cache.",
        value=stats.queried_tokens,
    )
    yield CounterMetricFamily(
        "semantic_prefix_cache_hit_tokens",
        "Prompt tokens found in the prefix cache.",
        value=stats.hit_tokens,
    )
    restored = CounterMetricFamily(
        "semantic_restored_tokens",
        "Prompt tokens restored, by the tier they came from.",
        labels=["tier"],
    )
    restored.add_metric(["memory"], stats.hot_restored_tokens)
    restored.add_metric(["disk"], stats.disk_restored_tokens)
    yield restored
    yield CounterMetricFamily(
        "semantic_corrupt_blocks",
        "Block files that failed verification and were quarantined.",
        value=stats.corrupt_blocks,
    )
    yield CounterMetricFamily(
        "semantic_blocks_written", "Block files written.", value=stats.blocks_written
    )
    yield CounterMetricFamily(
        "semantic_block_bytes_written",
        "Bytes of block files written.",
        value=stats.bytes_written,
    )
    yield CounterMetricFamily(
        "semantic_saves_failed",
        "Saves of a finished request's KV that failed (a full or read-only disk, say): "
        "that KV stays in memory only.",
        value=stats.saves_failed,
    )
    yield CounterMetricFamily(
        "semantic_blocks_evicted_from_disk",
        "Block files dropped to keep the disk quota or the disk's free space.",
        value=stats.blocks_evicted,
    )
    yield CounterMetricFamily(
        "semantic_blocks_expired",
        "Blocks moved from memory to disk as their agents' TTL ended (retention hints).",
        value=stats.blocks_expired,
    )


def _disk(disk: DiskState) -> Iterator[Metric]:
    """The data directory's free space, and whether agent turns are refused for it."""
    if disk.free_bytes is not None:
        yield GaugeMetricFamily(
            "semantic_disk_free_bytes",
            "Free bytes on the data directory's disk.",
            value=disk.free_bytes,
        )
    yield GaugeMetricFamily(
        "semantic_disk_full",
        "1 while a full disk, with nothing cached left to free, refuses agent turns.",
        value=int(disk.refused is not None),
    )


def _shared_tier(state: str | None, stats: CacheStats) -> Iterator[Metric]:
    """The shared block tier's reachability and what went through it (none without one)."""
    if state is None:
        return
    yield GaugeMetricFamily(
        "semantic_shared_blocks_reachable",
        "1 while the shared block tier (--shared-blocks) answers, 0 while it is unreachable "
        "and the instance serves from its own memory and disk.",
        value=int(state == "ok"),
    )
    events = CounterMetricFamily(
        "semantic_shared_blocks",
        "Blocks through the shared tier: published, fetched (this disk lacked them), missed, "
        "corrupt (checksum failed: deleted there, recomputed), dropped (not published: the "
        "tier unreachable or the queue full), trimmed (removed there: a namespace's quota).",
        labels=["event"],
    )
    events.add_metric(["published"], stats.shared_published)
    events.add_metric(["fetched"], stats.shared_fetched)
    events.add_metric(["missed"], stats.shared_misses)
    events.add_metric(["corrupt"], stats.shared_corrupt)
    events.add_metric(["dropped"], stats.shared_dropped)
    events.add_metric(["trimmed"], stats.shared_trimmed)
    yield events


def _namespaces(services: Services, disk: Mapping[str, int] | None) -> Iterator[Metric]:
    """Each namespace's memory and disk, and the quotas set (``--namespace-quotas``)."""
    memory = GaugeMetricFamily(
        "semantic_namespace_memory_bytes",
        "Memory the namespace's cached KV holds.",
        labels=["namespace"],
    )
    for namespace, held in sorted(services.cache.memory_by_namespace().items()):
        memory.add_metric([namespace], held)
    yield memory
    if disk is not None:
        on_disk = GaugeMetricFamily(
            "semantic_namespace_disk_bytes",
            "Bytes of block files the namespace's cached KV holds on disk.",
            labels=["namespace"],
        )
        for namespace, held in sorted(disk.items()):
            on_disk.add_metric([namespace], held)
        yield on_disk
    quotas = GaugeMetricFamily(
        "semantic_namespace_quota_bytes",
        "The namespace's hard limit on a tier (memory, disk, shared).",
        labels=["namespace", "tier"],
    )
    for namespace, quota in sorted(services.cache.quotas.limited().items()):
        limits = ("memory", quota.memory_bytes), ("disk", quota.disk_bytes)
        for tier, limit in (*limits, ("shared", quota.shared_bytes)):
            if limit is not None:
                quotas.add_metric([namespace, tier], limit)
    yield quotas
