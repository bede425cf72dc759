"""How fast the dashboard pages through many agents (ADR 0027).

    python -m benchmarks.dashboard [--agents 10000] [--runs 5]

Fills a SQLite metadata store (in a temporary directory, as the server keeps it) with
``--agents`` agents in 20 namespaces: each namespace's agents share its system prompt's
block, and each has one to six blocks of its own, so the page has blocks to count per tier.
A tenth of the agents have turns in the history, and a tenth of the blocks are in memory.
Then it times what the page asks every few seconds: a page of 50 agents sorted each way
the table sorts, the namespaces' usage, one agent's detail, and the hour's history. Each
line is the median of ``--runs``, wall time on this machine, in process (no HTTP: the
route only shapes 50 rows).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import random
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from benchmarks.common import median
from benchmarks.machine import print_machine
from semantic.adapters.storage.sql_metadata import SqlMetadataStore
from semantic.application.cache.hot_index import CACHE_OWNER, HotBlock, HotIndex
from semantic.application.dashboard.turn_history import TurnHistory
from semantic.application.dashboard.view import FRESH_S, SORT_KEYS, Dashboard, PageQuery
from semantic.domain.block_pool import BlockPool
from semantic.domain.blocks import KVBlock
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.generation import FinishedRequest, RequestStats
from semantic.ports.metadata_store import AgentRecord, BlockRecord

NAMESPACES = 20
SPEC = ModelCacheSpec(
    n_layers=2,
    n_kv_heads=1,
    k_head_dim=8,
    v_head_dim=8,
    kv_dtype="float32",
    layer_windows=(None, None),
)


def _key(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


async def fill(metadata: SqlMetadataStore, agents: int, seed: int) -> list[AgentRecord]:
    """``agents`` agents with their blocks, saved as the server saves them."""
    chance = random.Random(seed)
    made: list[AgentRecord] = []
    started = time.perf_counter()
    for i in range(agents):
        namespace = f"tenant-{i % NAMESPACES}"
        root = _key(namespace, "system")
        own = [_key(namespace, i, b) for b in range(chance.randint(1, 6))]
        keys = (root, *own)
        parents = ("", root, *own[:-1])
        new = [
            BlockRecord(key, parent, namespace, (1,) * 256, 256 * 64, "sum")
            for key, parent in zip(keys, parents, strict=True)
            if key != root or i < NAMESPACES
        ]
        record = AgentRecord(namespace, f"agent-{i:05d}", keys, 256 * len(keys))
        await metadata.save_agent_blocks(record, new)
        made.append(record)
        if (i + 1) % 2000 == 0:
            print(f"  {i + 1} agents saved ({time.perf_counter() - started:.0f} s)", flush=True)
    return made


def history_of(records: list[AgentRecord], seed: int) -> TurnHistory:
    chance = random.Random(seed)
    history = TurnHistory()
    now = time.time()
    for record in records[:: max(1, len(records) // (len(records) // 10 or 1))]:
        for turn in range(3):
            cached = chance.randint(0, record.token_count)
            stats = RequestStats(0.0, 0.05, 0.2, cached, record.token_count - cached, 16)
            history.on_finished(
                FinishedRequest(
                    record.namespace,
                    record.agent_id,
                    record.token_count,
                    stats,
                    0.3,
                    0.05 + chance.random() / 10,
                    now - 60 * chance.randint(0, 59) - turn,
                )
            )
    return history


def memory_of(records: list[AgentRecord]) -> HotIndex:
    """A tenth of the agents' own blocks in memory, one pool block per layer each."""
    pool = BlockPool(len(records) * 2 * SPEC.n_layers * 7)
    hot = HotIndex(pool)
    for record in records[::10]:
        for index, key in enumerate(record.block_keys[1:], start=1):
            layers = tuple(
                KVBlock(pool.allocate(CACHE_OWNER, layer)[0], layer, index, 256, None)
                for layer in range(SPEC.n_layers)
            )
            hot.add(HotBlock(key, "", index, (), layers))
    return hot


class Ticking:
    """A clock a second further on at each look: no read is fresh for the next call, so
    each line times a cold read (the page's refresh every few seconds finds none)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += FRESH_S
        return self.now


async def longest_stall(step: Callable[[], Awaitable[object]]) -> float:
    """The longest the event loop went unanswered while ``step`` ran (ms): what a token
    stream on the same loop would have waited."""
    worst = 0.0
    running = True

    async def tick() -> None:
        nonlocal worst
        while running:
            started = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, time.perf_counter() - started - 0.001)

    ticker = asyncio.create_task(tick())
    await step()
    running = False
    await ticker
    return worst * 1e3


def refresh_of(
    metadata: SqlMetadataStore, records: list[AgentRecord]
) -> Callable[[], Awaitable[object]]:
    """What the page asks at once, on a dashboard of its own (nothing read before)."""
    dashboard = Dashboard(
        metadata,
        metadata,
        memory_of(records),
        history_of(records, 7),
        pool_block_bytes=SPEC.block_bytes,
    )

    async def refresh() -> object:
        return await asyncio.gather(
            dashboard.usage(None), dashboard.agents(None, PageQuery(limit=50))
        )

    return refresh


async def timed(runs: int, step: Callable[[], Awaitable[object]]) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        await step()
        times.append((time.perf_counter() - started) * 1e3)
    return median(times)


async def measure(directory: Path, agents: int, runs: int) -> None:
    metadata = SqlMetadataStore(directory / "semantic.db")
    await metadata.open()
    try:
        records = await fill(metadata, agents, seed=7)
        dashboard = Dashboard(
            metadata,
            metadata,
            memory_of(records),
            history_of(records, seed=7),
            pool_block_bytes=SPEC.block_bytes,
            clock=Ticking(),
        )
        print(f"{agents} agents in {NAMESPACES} namespaces; median of {runs} runs, in ms:")
        for sort in SORT_KEYS:
            page = PageQuery(sort=sort, limit=50)
            ms = await timed(runs, functools.partial(dashboard.agents, None, page))
            print(f"  agents page sorted by {sort:<14} {ms:8.1f}")
        one = functools.partial(dashboard.agents, {"tenant-3"}, PageQuery(limit=50))
        print(f"  agents page of one namespace      {await timed(runs, one):8.1f}")
        usage = functools.partial(dashboard.usage, None)
        print(f"  namespaces' usage                 {await timed(runs, usage):8.1f}")
        pick = records[len(records) // 2]
        detail = functools.partial(dashboard.agent, pick.namespace, pick.agent_id)
        print(f"  one agent's detail                {await timed(runs, detail):8.1f}")
        hour = functools.partial(asyncio.to_thread, dashboard.history.last_hour)
        print(f"  the last hour by minute           {await timed(runs, hour):8.1f}")
        ms = await timed(1, refresh_of(metadata, records))
        print(f"  one refresh (usage and a page)    {ms:8.1f}")
        stalls = [await longest_stall(refresh_of(metadata, records)) for _ in range(runs)]
        print(f"  longest event-loop stall in one   {median(stalls):8.1f}")
    finally:
        await metadata.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print_machine()
    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(measure(Path(directory), args.agents, args.runs))


if __name__ == "__main__":
    main()
