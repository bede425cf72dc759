"""The shipped ``deploy/haproxy.cfg``, as people run it (addresses from the environment) and
as the local cluster writes it for any number of instances: HAProxy itself checks both."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from reliability.services.haproxy import SHIPPED_CONFIG, haproxy_binary, haproxy_config


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
