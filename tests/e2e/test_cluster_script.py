"""``scripts/cluster.sh``'s program as a user runs it: it prints where the cluster answers,
the cluster answers there, and Ctrl-C (SIGINT to the whole foreground group) stops every
process it started and removes its temporary directory. One instance keeps it short."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from reliability.server import free_port

pytestmark = pytest.mark.model


def lines_until(stream: Iterator[str], last: str) -> list[str]:
    seen = []
    for line in stream:
        seen.append(line)
        if line.startswith(last):
            return seen
    raise AssertionError(f"the cluster ended before {last!r}: {seen}")


def listens(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_the_cluster_starts_answers_and_stops_whole_on_ctrl_c() -> None:
    port = free_port()
    command = [sys.executable, "-m", "reliability.cluster", "--instances", "1"]
    cluster = subprocess.Popen(
        [*command, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group, as a terminal's foreground job is
        env={**os.environ, "TMPDIR": tempfile.gettempdir()},  # not MLX's kernel cache (root's)
    )
    assert cluster.stdout is not None
    try:
        said = lines_until(cluster.stdout, "Ctrl-C stops them all.")
        assert f"semantic cluster: http://127.0.0.1:{port}" in "".join(said)
        reply = httpx.get(f"http://127.0.0.1:{port}/health", headers={"X-Agent-Id": "a"})
        assert reply.status_code == 200
        assert reply.headers["X-Semantic-Instance"] == "semantic1"
        ports = {int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", "".join(said))}
        assert len(ports) == 4, said  # HAProxy, the instance, PostgreSQL, Redis
        workdir = Path(re.findall(r"instances? in (\S+) \.\.\.", said[0])[0])
        assert workdir.is_dir()
        os.killpg(cluster.pid, signal.SIGINT)
        rest, _ = cluster.communicate(timeout=120)  # a hang fails here, not at the suite's 600 s
        assert cluster.returncode == 0, rest
    finally:
        if cluster.poll() is None:
            os.killpg(cluster.pid, signal.SIGKILL)
    assert rest.rstrip().endswith("stopped"), rest
    assert not [p for p in ports if listens(p)], "a process outlived the cluster"
    assert not workdir.exists()
