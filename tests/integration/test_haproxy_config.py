"""The shipped ``deploy/haproxy.cfg``, as people run it (addresses from the environment) and
as the local cluster writes it for any number of instances: HAProxy itself checks both."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import threading
from pathlib import Path

import httpx
import pytest
from reliability.services.haproxy import (
    SHIPPED_CONFIG,
    HAProxyServer,
    haproxy_binary,
    haproxy_config,
)


def checked(config: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [haproxy_binary(), "-c", "-f", str(config)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_the_shipped_file_is_valid_with_its_addresses_from_the_environment() -> None:
    addresses = {f"SEMANTIC_{i}": f"127.0.0.1:{8000 + i}" for i in (1, 2, 3)}
    done = checked(SHIPPED_CONFIG, {"SEMANTIC_LISTEN": "127.0.0.1:8080", **addresses})
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("instances", [1, 3, 5])
def test_the_cluster_s_config_has_one_server_per_instance(tmp_path: Path, instances: int) -> None:
    backends = [f"127.0.0.1:{9000 + i}" for i in range(instances)]
    text = haproxy_config("127.0.0.1:9999", backends)
    servers = [line.split() for line in text.splitlines() if line.strip().startswith("server ")]
    assert servers == [
        ["server", f"semantic{i + 1}", address] for i, address in enumerate(backends)
    ]
    assert "${" not in text
    config = tmp_path / "haproxy.cfg"
    config.write_text(text)
    done = checked(config)
    assert done.returncode == 0, done.stdout + done.stderr


class _DiesMidRequest(http.server.BaseHTTPRequestHandler):
    """An instance that is ready, then goes away with a turn in flight (a SIGKILL)."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.connection.shutdown(socket.SHUT_RDWR)  # no answer at all

    def log_message(self, *_: object) -> None:
        pass


def test_an_instance_gone_mid_request_is_a_503_with_retry_after_that_names_the_doubt(
    tmp_path: Path,
) -> None:
    """Issue 49: HAProxy's own 502 becomes a 503 a client retries, saying the turn may have
    been kept (read the transcript first), not a 5xx a client gives up on."""
    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _DiesMidRequest)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    router = HAProxyServer(tmp_path, [f"127.0.0.1:{backend.server_address[1]}"])
    try:
        with router.start():
            body = {"content": "hello"}
            answer = httpx.post(f"{router.url}/v1/agents/a/messages", json=body, timeout=30)
    finally:
        backend.shutdown()
    assert answer.status_code == 503, answer.text
    assert answer.headers["Retry-After"] == "1"
    assert "may or may not have been kept" in answer.json()["error"]["message"]
