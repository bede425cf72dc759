"""The stores a cluster's instances share: one PostgreSQL (metadata, transcripts, leases)
and one Redis (the shared block tier), each a real process on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from pathlib import Path
from typing import Any

from reliability.services.postgres import PostgresServer
from semantic.config import Settings

LEASE_SECONDS = 10.0
"""How long a dead instance's agents wait for another: short, for a local cluster."""


def _store(module: str, name: str, *args: Any) -> Any:
    """The store's process, if this checkout has its module yet (they land one by one)."""
    if importlib.util.find_spec(module) is None:
        return None
    return getattr(importlib.import_module(module), name)(*args)


def _have_leases() -> bool:
    return "leases" in {f.name for f in dataclasses.fields(Settings)}


class SharedStores:
    """Started before the instances, stopped after them; ``server_args`` are the flags
    that point an instance at them (and give it leases, so they take turns per agent)."""

    def __init__(self, workdir: Path, lease_seconds: float = LEASE_SECONDS) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.lease_seconds = lease_seconds
        self.postgres = PostgresServer(workdir / "postgres.log")
        self.redis = _store("reliability.services.redis", "RedisServer", workdir / "redis")

    @property
    def database_url(self) -> str:
        return self.postgres.url()

    @property
    def shared_blocks_url(self) -> str | None:
        return None if self.redis is None else str(self.redis.url)

    def start(self) -> None:
        self.postgres.start()
        if self.redis is not None:
            self.redis.start()

    def stop(self) -> None:
        if self.redis is not None:
            self.redis.stop()
        self.postgres.close()  # its own temporary directory goes with it

    def server_args(self) -> list[str]:
        args = ["--database-url", self.database_url]
        if _have_leases():
            args += ["--leases", "--lease-seconds", str(self.lease_seconds)]
        if self.shared_blocks_url is not None:
            args += ["--shared-blocks", self.shared_blocks_url]
        return args

    def describe(self) -> list[str]:
        return [
            f"PostgreSQL: {self.database_url}",
            f"Redis: {self.shared_blocks_url or 'not in this checkout yet'}",
        ]
