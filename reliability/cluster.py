"""A local cluster: PostgreSQL, Redis, several ``semantic serve`` instances and HAProxy, all
on 127.0.0.1 as ordinary processes under one directory. The one piece of code that starts a
cluster, for ``scripts/cluster.sh``, the cluster tests, ``benchmarks.cluster`` and the
reliability suite.

    python -m reliability.cluster [--instances 3] [--port 8000] [-- SERVE_ARGS...]
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import tempfile
import threading
import types
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from reliability.server import ServerProcess
from reliability.services.haproxy import HAProxyServer, server_name
from reliability.shared_stores import SharedStores


class LocalCluster:
    """``instances`` semantic servers behind one HAProxy (``url``); with ``shared`` they
    keep their metadata in one PostgreSQL and share blocks through one Redis, each with its
    own data directory. Started in that order, stopped in the reverse one."""

    def __init__(
        self,
        workdir: Path,
        instances: int = 3,
        *,
        shared: bool = True,
        server_args: Sequence[str] = (),
        port: int | None = None,
        env: dict[str, str] | None = None,
        stores: SharedStores | None = None,
    ) -> None:
        """``stores``: shared stores made by the caller (``SharedStores``' options) in place of
        the default ones."""
        self.workdir = workdir
        self.stores = stores or (SharedStores(workdir) if shared else None)
        self.server_args = tuple(server_args)
        self.env = env
        self.servers = [self._server(i) for i in range(instances)]
        self.router = HAProxyServer(
            workdir / "haproxy", [f"127.0.0.1:{s.port}" for s in self.servers], port
        )
        self.url = self.router.url

    def _server(self, index: int, port: int | None = None) -> ServerProcess:
        return ServerProcess(
            self.workdir / f"instance-{index + 1}",
            *self.server_args,
            *(self.stores.server_args() if self.stores else ()),
            env=self.env,
            port=port,
        )

    def start(self) -> LocalCluster:
        try:
            if self.stores is not None:
                self.stores.start()
            with ThreadPoolExecutor(len(self.servers)) as pool:  # each loads the model
                list(pool.map(ServerProcess.start, self.servers))
            self.router.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Everything that runs, whatever failed before: the router first, so nothing new
        arrives, then the instances (SIGTERM: they drain and flush), then the stores."""
        with contextlib.suppress(Exception):
            self.router.stop()
        for server in self.servers:
            _stop(server)
        if self.stores is not None:
            self.stores.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def index_of(self, instance: str) -> int:
        """The server behind HAProxy's name for it (its ``X-Semantic-Instance`` header)."""
        for index in range(len(self.servers)):
            if server_name(index) == instance:
                return index
        raise KeyError(instance)

    def kill(self, index: int) -> None:
        """SIGKILL one instance: a crash, its leases left to expire."""
        self.servers[index].kill()

    def restart(self, index: int) -> ServerProcess:
        """The instance again, on its port (where the router looks) and its data dir; a
        running one is stopped first as a service manager would (SIGTERM: it flushes)."""
        old = self.servers[index]
        _stop(old)
        self.servers[index] = self._server(index, old.port).start()
        return self.servers[index]


def _stop(server: ServerProcess) -> None:
    """SIGTERM if it runs; SIGKILL if it will not stop."""
    if server.process is not None and server.process.poll() is None:
        try:
            server.stop()
        except subprocess.TimeoutExpired:
            server.kill()


def main(argv: Sequence[str] | None = None) -> None:
    """Start a cluster, print where it answers, and stop it all on Ctrl-C or SIGTERM."""
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    with workdir_at(args.dir) as workdir:
        cluster = LocalCluster(
            workdir,
            args.instances,
            shared=not args.no_shared,
            server_args=args.serve_args,
            port=args.port,
        )
        print(f"starting {args.instances} instances in {workdir} ...", flush=True)
        with cluster:
            _describe(cluster)
            _until_asked_to_stop()
            print("\nstopping the cluster ...", flush=True)
    print("stopped", flush=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cluster", description=main.__doc__)
    parser.add_argument("--instances", type=int, default=3, help="semantic instances (3)")
    parser.add_argument("--port", type=int, default=8000, help="HAProxy's port (8000)")
    parser.add_argument("--dir", type=Path, help="keep everything here (default: a temp dir)")
    parser.add_argument(
        "--no-shared", action="store_true", help="no PostgreSQL or Redis: each instance alone"
    )
    parser.add_argument("serve_args", nargs="*", help="after --: more `semantic serve` flags")
    return parser


@contextlib.contextmanager
def workdir_at(given: Path | None, prefix: str = "semantic-cluster-") -> Iterator[Path]:
    """``given`` (made if need be, kept), else a temporary directory removed afterwards."""
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        yield given
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield Path(tmp)


def _describe(cluster: LocalCluster) -> None:
    lines = [f"semantic cluster: {cluster.url}  (HAProxy, by X-Agent-Id)"]
    lines += [f"  {server_name(i)}: {s.url}  log {s.log}" for i, s in enumerate(cluster.servers)]
    if cluster.stores is not None:
        lines += [f"  {line}" for line in cluster.stores.describe()]
    lines.append(f"  HAProxy log {cluster.router.log}")
    lines.append("Ctrl-C stops them all.")
    print("\n".join(lines), flush=True)


def _interrupt(_signum: int, _frame: types.FrameType | None) -> None:
    raise KeyboardInterrupt


def _until_asked_to_stop() -> None:
    """Wait for Ctrl-C or SIGTERM. A flag the handlers set, not ``signal.pause()``: a
    signal that landed between the last line printed and the pause was taken by its
    handler, and the pause then waited for another one for ever (a CI run hung so)."""
    asked = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda _signum, _frame: asked.set())
    asked.wait()


if __name__ == "__main__":
    main(sys.argv[1:])
