"""A PostgreSQL server of its own, on a free loopback port, in a temporary directory.

Debian's binaries (``/usr/lib/postgresql/<version>/bin``); PostgreSQL refuses to run as
root, so as root the server runs as the ``postgres`` user, which owns the directory. Trust
authentication on loopback only, and no fsync: a test server, fast, never the system one.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from reliability.server import free_port
from reliability.services.process import ServiceProcess, tail

USER = "semantic"
"""The database superuser initdb creates; any password is accepted (trust)."""


def postgres_bin() -> Path:
    """The newest Debian PostgreSQL's binaries, else whatever ``postgres`` is on the path."""
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/postgres"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if versions:
        return versions[-1].parent
    found = shutil.which("postgres")
    if found is None:
        raise FileNotFoundError("no PostgreSQL: apt-get install postgresql (scripts/setup.sh)")
    return Path(found).parent


class PostgresServer:
    """``start`` runs initdb (once) and the server; ``create_database`` makes one per test;
    ``stop`` shuts it down keeping its data (``start`` again brings it back on the same
    port); ``close`` stops it and removes everything."""

    def __init__(self, log: Path | None = None) -> None:
        self.bin = postgres_bin()
        self.root = Path(tempfile.mkdtemp(prefix="semantic-postgres-", dir=_reachable_tmp()))
        self.data = self.root / "data"
        self.port = free_port()
        self.log = log or self.root / "postgres.log"
        self._as_user: dict[str, Any] = {}
        if os.geteuid() == 0:  # PostgreSQL will not run as root
            self._as_user = {"user": "postgres", "group": "postgres", "extra_groups": []}
            shutil.chown(self.root, "postgres", "postgres")
        self._service = ServiceProcess(
            [
                str(self.bin / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-k",
                str(self.root),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
            ],
            self.log,
            self.port,
            cwd=self.root,
            **self._as_user,
        )

    def url(
        self, database: str = "postgres", password: str | None = None, port: int | None = None
    ) -> str:
        """A SQLAlchemy URL for semantic (``postgresql+asyncpg``); ``port``: a link to the
        server's (``SlowLink``) instead of its own."""
        secret = f":{password}" if password else ""
        where = f"127.0.0.1:{port or self.port}"
        return f"postgresql+asyncpg://{USER}{secret}@{where}/{database}"

    def start(self, timeout: float = 60.0) -> PostgresServer:
        if not self.data.exists():
            self._run(
                "initdb",
                "-D",
                str(self.data),
                "-U",
                USER,
                "--auth=trust",
                "--encoding=UTF8",
                "--no-locale",
                "--no-sync",
            )
        self._service.start(timeout)
        self._wait_ready(timeout)
        return self

    def create_database(self, name: str) -> str:
        """A new, empty database; returns its URL."""
        self._client("createdb", name)
        return self.url(name)

    def cut_sessions(self, database: str) -> int:
        """End every session on ``database`` at once (``pg_terminate_backend``), as a
        dropped connection or a failover would, in whatever transaction it is; how many."""
        query = (
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            f"WHERE datname = '{database}' AND pid <> pg_backend_pid()"
        )
        command = [str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER]
        done = subprocess.run(
            [*command, "-d", "postgres", "-tAc", query], capture_output=True, check=False
        )
        self._check(done)
        return int(done.stdout.decode().strip() or 0)

    def stop(self, timeout: float = 20.0) -> None:
        """A fast shutdown (SIGINT): open sessions are ended, not waited for."""
        self._service.signal(signal.SIGINT)
        self._service.stop(timeout)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    def _wait_ready(self, timeout: float) -> None:
        """The port opens before the server accepts sessions (it is still starting up)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready = subprocess.run(
                [str(self.bin / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                check=False,
            )
            if ready.returncode == 0:
                return
            time.sleep(0.05)
        raise TimeoutError(f"PostgreSQL not ready after {timeout:.0f} s: {tail(self.log)}")

    def _client(self, program: str, *args: str) -> None:
        command = [str(self.bin / program), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER]
        self._check(subprocess.run([*command, *args], capture_output=True, check=False))

    def _run(self, program: str, *args: str) -> None:
        done = subprocess.run(
            [str(self.bin / program), *args],
            capture_output=True,
            check=False,
            cwd=self.root,
            **self._as_user,
        )
        self._check(done)

    @staticmethod
    def _check(done: subprocess.CompletedProcess[bytes]) -> None:
        if done.returncode != 0:
            said = (done.stderr or done.stdout).decode(errors="replace")[-2000:]
            raise RuntimeError(f"{done.args[0]} exited with {done.returncode}: {said}")


def _reachable_tmp() -> str:
    """Where the ``postgres`` user can reach: a process that loaded MLX points ``TMPDIR`` at
    its kernel cache under the user's home (``adapters/mlx/jit.py``), which ``postgres``
    cannot enter, so children of such a process would fail ``initdb``."""
    here = tempfile.gettempdir()
    return "/tmp" if here.startswith(str(Path.home())) and Path("/tmp").is_dir() else here
