"""The faults ``reliability.cluster_faults`` injects into a running ``LocalCluster``, one at a
time: each starts when called and returns how to end it (what a person or a supervisor would
do: restart the killed, continue the paused, start the store again, free the disk)."""

from __future__ import annotations

import random
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from reliability.cluster import LocalCluster
from reliability.full_disk import fill
from reliability.shared_stores import SharedStores

Recover = Callable[[], None]
SLOW_LINK_S = 0.2
"""Each way, on both stores' links: a round trip of 400 ms, ~100x a local one."""


@dataclass(frozen=True)
class Fault:
    kind: str
    inject: Callable[[LocalCluster, random.Random], Recover]
    hold_s: float
    """How long it lasts before it is ended."""


def kill(cluster: LocalCluster, rng: random.Random) -> Recover:
    """SIGKILL: its turns in flight are cut, its leases left to expire."""
    index = rng.randrange(len(cluster.servers))
    cluster.kill(index)
    return lambda: _restarted(cluster, index)


def pause(cluster: LocalCluster, rng: random.Random) -> Recover:
    """SIGSTOP past the lease, then SIGCONT: whatever it writes after must be refused."""
    index = rng.randrange(len(cluster.servers))
    process = cluster.servers[index].process
    assert process is not None
    process.send_signal(signal.SIGSTOP)
    return lambda: process.send_signal(signal.SIGCONT)


def redis_stop(cluster: LocalCluster, _rng: random.Random) -> Recover:
    stores = _stores(cluster)
    stores.redis.stop()
    return stores.redis.start


def redis_flush(cluster: LocalCluster, _rng: random.Random) -> Recover:
    """Redis restarted empty, as far as its contents go."""
    port = _stores(cluster).redis.port
    subprocess.run(["redis-cli", "-p", str(port), "FLUSHALL"], capture_output=True, check=True)
    return lambda: None


def postgres_restart(cluster: LocalCluster, _rng: random.Random) -> Recover:
    stores = _stores(cluster)
    stores.postgres.stop()

    def recover() -> None:
        stores.postgres.start()

    return recover


def postgres_cut(cluster: LocalCluster, _rng: random.Random) -> Recover:
    """Every session ended at once, in whatever transaction: a dropped connection."""
    _stores(cluster).postgres.cut_sessions("postgres")
    return lambda: None


def slow_stores(cluster: LocalCluster, _rng: random.Random) -> Recover:
    links = _stores(cluster).links
    assert links is not None, "the cluster's stores were made without slow links"
    for link in links:
        link.delay_s = SLOW_LINK_S

    def recover() -> None:
        for link in links:
            link.delay_s = 0.0

    return recover


def disk_full(cluster: LocalCluster, rng: random.Random) -> Recover:
    """Another program fills the instance's disk (its data directory is a tmpfs of its own,
    ``cluster_faults`` mounts them); it lets go after the hold."""
    index = rng.randrange(len(cluster.servers))
    filler = cluster.servers[index].data_dir / "other-program.bin"
    fill(filler)
    return lambda: filler.unlink(missing_ok=True)


FAULTS = (
    Fault("kill", kill, 0.0),
    Fault("pause", pause, 0.0),  # its hold is the lease's: set by the loop
    Fault("redis-stop", redis_stop, 3.0),
    Fault("redis-flush", redis_flush, 0.0),
    Fault("postgres-restart", postgres_restart, 2.0),
    Fault("postgres-cut", postgres_cut, 0.0),
    Fault("slow-stores", slow_stores, 4.0),
    Fault("disk-full", disk_full, 4.0),
)


def _restarted(cluster: LocalCluster, index: int) -> None:
    server = cluster.servers[index]
    if server.process is not None:
        server.process.wait(timeout=30)
    cluster.restart(index)


def _stores(cluster: LocalCluster) -> SharedStores:
    assert cluster.stores is not None, "faults need the shared stores"
    return cluster.stores
