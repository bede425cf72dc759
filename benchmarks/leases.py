"""What an agent's lease costs per turn on the metadata database (ADR 0025).

    python -m benchmarks.leases [--runs 200] [--database-url postgresql+asyncpg://...]

A leased turn adds a take and a release (two small transactions, each fsynced on SQLite),
a renewal every third of the lease time, and the fence, one UPDATE first in each fenced
write's transaction. Printed: the median of each over ``--runs``, and a transcript append
with and without the fence, the two alternating run by run so the machine's drift falls
on both alike. SQLite in a temporary directory (``synchronous=FULL``, as the server), or
the database at ``--database-url`` (a new, empty one: the benchmark makes its agent).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from benchmarks.common import median
from benchmarks.machine import print_machine
from semantic.adapters.storage.sql_leases import SqlLeases
from semantic.adapters.storage.sql_metadata import SqlMetadataStore
from semantic.ports.metadata_store import AgentRecord, MessageRecord

NS, AGENT, HOLDER = "bench", "agent", "bench:1:0"


async def timed(step: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    await step()
    return (time.perf_counter() - started) * 1e3


async def measure(directory: Path, runs: int, url: str | None) -> dict[str, list[float]]:
    metadata = SqlMetadataStore(directory / "semantic.db", url)
    await metadata.open()
    leases = SqlLeases(metadata.engine)
    await metadata.create_agent(AgentRecord(NS, AGENT, keeps_transcript=True))
    times: dict[str, list[float]] = {k: [] for k in ("take", "release", "renew", "plain", "fenced")}
    try:
        for _ in range(runs):
            for name, value in (await one_turn(metadata, leases)).items():
                times[name].append(value)
    finally:
        await metadata.close()
    return times


async def one_turn(metadata: SqlMetadataStore, leases: SqlLeases) -> dict[str, float]:
    """A turn's lease writes, each timed, with a transcript append with and without it."""
    turn = [MessageRecord("user", "hi"), MessageRecord("assistant", "hello")]
    started = time.perf_counter()
    lease = await leases.take(NS, AGENT, HOLDER, 30.0)
    took = (time.perf_counter() - started) * 1e3
    append = metadata.append_messages
    return {
        "take": took,
        "renew": await timed(lambda: leases.renew(lease, 30.0)),
        "plain": await timed(lambda: append(NS, AGENT, turn)),
        "fenced": await timed(lambda: append(NS, AGENT, turn, lease=lease)),
        "release": await timed(lambda: leases.release(lease)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    print_machine()
    with tempfile.TemporaryDirectory() as directory:
        times = asyncio.run(measure(Path(directory), args.runs, args.database_url))
    for name, values in times.items():
        print(f"{name:>8}: median {median(values):.2f} ms over {len(values)} runs")
    added = median(times["take"]) + median(times["release"])
    fence = median(times["fenced"]) - median(times["plain"])
    print(f"a leased turn adds {added:.2f} ms (take + release) and {fence:.2f} ms per fenced write")


if __name__ == "__main__":
    main()
