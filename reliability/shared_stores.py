"""The stores a cluster's instances share: one PostgreSQL (metadata, transcripts, leases)
and one Redis (the shared block tier), each a real process on 127.0.0.1 in ``workdir``."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any


def _store(module: str, name: str, workdir: Path) -> Any:
    """The store's process, if this checkout has its module yet (they land one by one)."""
    if importlib.util.find_spec(module) is None:
        return None
    return getattr(importlib.import_module(module), name)(workdir)


class SharedStores:
    """Started before the instances, stopped after them; ``server_args`` are the flags
    that point an instance at them."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.postgres = _store("reliability.services.postgres", "PostgresServer", workdir / "pg")
        self.redis = _store("reliability.services.redis", "RedisServer", workdir / "redis")

    def start(self) -> None:
        for store in (self.postgres, self.redis):
            if store is not None:
                store.start()

    def stop(self) -> None:
        for store in (self.redis, self.postgres):
            if store is not None:
                store.stop()

    def server_args(self) -> list[str]:
        args: list[str] = []
        if self.postgres is not None:
            args += ["--database-url", self.postgres.url]
        if self.redis is not None:
            args += ["--shared-blocks", self.redis.url]
        return args

    def describe(self) -> list[str]:
        return [
            f"PostgreSQL: {self.postgres.url}" if self.postgres else "PostgreSQL: not used",
            f"Redis: {self.redis.url}" if self.redis else "Redis: not used",
        ]
