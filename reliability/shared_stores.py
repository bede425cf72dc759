"""The stores a cluster's instances share: one PostgreSQL (metadata, transcripts, leases)
and one Redis (the shared block tier), each a real process on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

from reliability.services.postgres import PostgresServer
from reliability.services.redis import RedisServer

LEASE_SECONDS = 10.0
"""How long a dead instance's agents wait for another: short, for a local cluster."""


class SharedStores:
    """Started before the instances, stopped after them; ``server_args`` are the flags
    that point an instance at them (and give it leases, so they take turns per agent)."""

    def __init__(self, workdir: Path, lease_seconds: float = LEASE_SECONDS) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.lease_seconds = lease_seconds
        self.postgres = PostgresServer(workdir / "postgres.log")
        self.redis = RedisServer(workdir / "redis")

    @property
    def database_url(self) -> str:
        return self.postgres.url()

    @property
    def shared_blocks_url(self) -> str:
        return self.redis.url

    def start(self) -> None:
        self.postgres.start()
        self.redis.start()

    def stop(self) -> None:
        self.redis.stop()
        self.postgres.close()  # its own temporary directory goes with it

    def server_args(self) -> list[str]:
        return [
            *("--database-url", self.database_url),  # and with it, leases (ADR 0025)
            *("--lease-seconds", str(self.lease_seconds)),
            *("--shared-blocks", self.shared_blocks_url),
        ]

    def describe(self) -> list[str]:
        return [
            f"PostgreSQL: {self.database_url}",
            f"Redis: {self.shared_blocks_url}",
        ]
