"""One background service process: started, waited for on its TCP port, stopped."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


def wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    """Until something accepts on 127.0.0.1:``port``; a process that exits first fails with
    the tail of its log, which says why (a missing package, a port taken, a bad config)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{log.name} exited with {process.returncode}: {tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s: {tail(log)}")


def tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class ServiceProcess:
    """A command whose output goes to ``log``; ``stop`` sends SIGTERM, then SIGKILL."""

    def __init__(self, command: Sequence[str], log: Path, port: int, **popen: object) -> None:
        self.command = list(command)
        self.log = log
        self.port = port
        self.popen = popen
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.command,
                stdout=out,
                stderr=subprocess.STDOUT,
                **self.popen,  # type: ignore[call-overload]  # popen options pass through
            )
        wait_for_port(self.port, self.process, self.log, timeout)

    def signal(self, number: signal.Signals) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, number)

    def stop(self, timeout: float = 20.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout)
