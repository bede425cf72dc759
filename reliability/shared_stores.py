"""The stores a cluster's instances share: one PostgreSQL (metadata, transcripts, leases)
and one Redis (the shared block tier), each a real process on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

from reliability.services.postgres import PostgresServer
from reliability.services.redis import RedisServer
from reliability.services.slow_link import SlowLink

LEASE_SECONDS = 10.0
"""How long a dead instance's agents wait for another: short, for a local cluster."""


class SharedStores:
    """Started before the instances, stopped after them; ``server_args`` are the flags
    that point an instance at them (and give it leases, so they take turns per agent)."""

    def __init__(
        self, workdir: Path, lease_seconds: float = LEASE_SECONDS, *, slow_links: bool = False
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.lease_seconds = lease_seconds
        self.postgres = PostgresServer(workdir / "postgres.log")
        self.redis = RedisServer(workdir / "redis")
        self.links = (
            (SlowLink(self.postgres.port), SlowLink(self.redis.port)) if slow_links else None
        )
        """With ``slow_links``, the instances reach each store through a link that can be
        made slow (``SlowLink.delay_s``): PostgreSQL's, then Redis's."""

    @property
    def database_url(self) -> str:
        return self.postgres.url(port=self.links[0].port if self.links else None)

    @property
    def shared_blocks_url(self) -> str:
        return f"redis://127.0.0.1:{self.links[1].port}/0" if self.links else self.redis.url

    def start(self) -> None:
        self.postgres.start()
        self.redis.start()
        for link in self.links or ():
            link.start()

    def stop(self) -> None:
        for link in self.links or ():
            link.stop()
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
