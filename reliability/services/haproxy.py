"""A real HAProxy in front of semantic instances, with the shipped ``deploy/haproxy.cfg``."""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from reliability.server import free_port
from reliability.services.process import ServiceProcess

SHIPPED_CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "haproxy.cfg"
_SERVER_LINE = re.compile(r"^(\s*)server semantic\d+ .*\n", re.MULTILINE)


def server_name(index: int) -> str:
    """The name HAProxy gives the ``index``-th backend (from 0), as its
    ``X-Semantic-Instance`` response header says it."""
    return f"semantic{index + 1}"


def haproxy_config(listen: str, backends: Sequence[str], shipped: Path = SHIPPED_CONFIG) -> str:
    """The shipped configuration listening on ``listen`` with one server line per address in
    ``backends``: one file for people and tests, whatever the number of instances."""
    text = shipped.read_text()
    first = _SERVER_LINE.search(text)
    if first is None:
        raise ValueError(f"{shipped} has no 'server semanticN' line to fill in")
    indent = first.group(1)
    servers = "".join(
        f"{indent}server {server_name(i)} {address}\n" for i, address in enumerate(backends)
    )
    text = text[: first.start()] + servers + _SERVER_LINE.sub("", text[first.start() :])
    return text.replace('"${SEMANTIC_LISTEN}"', listen)


def haproxy_binary() -> str:
    """Debian puts it in /usr/sbin, which an ordinary user's PATH may lack."""
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise FileNotFoundError("haproxy is not installed: run scripts/setup.sh")
    return found


class HAProxyServer:
    """HAProxy in the foreground (``-db``) on a free loopback port, routing to ``backends``
    (``host:port`` each); its config and log live in ``workdir``."""

    def __init__(self, workdir: Path, backends: Sequence[str], port: int | None = None) -> None:
        self.workdir = workdir
        self.backends = list(backends)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = workdir / "haproxy.cfg"
        self.log = workdir / "haproxy.log"
        self.process = ServiceProcess(
            [haproxy_binary(), "-f", str(self.config), "-db"], self.log, self.port
        )

    def start(self, timeout: float = 30.0) -> HAProxyServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config.write_text(haproxy_config(f"127.0.0.1:{self.port}", self.backends))
        self.process.start(timeout)
        return self

    def stop(self) -> None:
        self.process.stop()

    def __enter__(self) -> HAProxyServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
