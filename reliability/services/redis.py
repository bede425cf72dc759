"""A real ``redis-server`` on a free loopback port, in its own directory, never persisting.

Debian's ``redis-server`` package (``scripts/setup.sh`` installs it where missing). Nothing is
saved to disk (``--save ''``, no append-only file): the shared block tier is a cache. A
memory cap with an LRU policy can be given, as a deployment would set it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from reliability.server import free_port
from reliability.services.process import ServiceProcess


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


class RedisServer(ServiceProcess):
    def __init__(self, directory: Path, *, maxmemory: str | None = None) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise FileNotFoundError("redis-server is not installed (apt-get install redis-server)")
        directory.mkdir(parents=True, exist_ok=True)
        port = free_port()
        command = [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(directory),
        ]
        if maxmemory is not None:
            command += ["--maxmemory", maxmemory, "--maxmemory-policy", "allkeys-lru"]
        super().__init__(command, directory / f"redis-{port}.log", port)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"
