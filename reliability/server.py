"""A real ``semantic serve`` process on 127.0.0.1, for end-to-end tests and the suites."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

_LIMIT_THEN_EXEC = (
    "import os, resource, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2]))); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[3:]])"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    def __init__(
        self,
        data_dir: Path,
        *args: str,
        env: dict[str, str] | None = None,
        nofile: tuple[int, int] | None = None,
        log: Path | None = None,
        port: int | None = None,
        log_info: bool = True,
    ) -> None:
        """``nofile``: the server's descriptor limit (soft, hard) at its start; ``log``: where
        its output goes (default: a file in ``data_dir``); ``port``: a given one (a restart
        where a router expects it), else a free one; ``log_info``: serve with
        ``--log-info`` (False: the default log level, as a user starts it)."""
        self.log_info = log_info
        self.data_dir = data_dir
        self.nofile = nofile
        self.args = args
        self.env = {**os.environ, **(env or {})}
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.log = log or data_dir / f"server-{self.port}.log"  # elsewhere for a disk to fill

    def start(self, timeout: float = 180.0) -> ServerProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "semantic.adapters.cli.main",
            "serve",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            *(["--log-info"] if self.log_info else []),
            *self.args,
        ]
        if self.nofile is not None:  # set in the child, which then becomes the server
            command[1:1] = ["-c", _LIMIT_THEN_EXEC, *map(str, self.nofile)]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=self.env
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.process.returncode}:\n{self.log.read_text()[-3000:]}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"server not ready in {timeout}s:\n{self.log.read_text()[-3000:]}")

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, as a service manager would; returns the exit code."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def kill_during(
        self,
        workers: list[threading.Thread],
        stop: threading.Event,
        seconds: float,
        acknowledged: threading.Event | None = None,
    ) -> None:
        """Start ``workers``, kill -9 the server after ``seconds`` of their traffic, then tell
        them to stop and wait for them: a crash in the middle of real work. ``acknowledged``:
        the seconds count from when it is set (the workers' first reply), so that a slow or
        busy machine still kills after something was acknowledged, not before."""
        for worker in workers:
            worker.start()
        if acknowledged is not None:
            acknowledged.wait(300)
        time.sleep(seconds)
        self.kill()
        stop.set()
        for worker in workers:
            worker.join()

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, like a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *_: object) -> None:
        """Whatever went wrong in between, no server outlives its user."""
        self.kill()

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and (labels is None or sample.labels == labels):
                    return float(sample.value)
        raise KeyError(name)
