"""Connections as the SDKs' own transport (httpx) uses them."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from reliability.server import ServerProcess

pytestmark = pytest.mark.model


def test_an_idle_connection_outlives_the_clients_own_keep_alive(server: ServerProcess) -> None:
    """httpx, under the OpenAI and Anthropic SDKs, sends a request on an idle connection for
    up to 5 s: the server keeps the connection longer, so such a request never meets a
    socket the server is closing (an agent back from a 5 s tool call lost its turn so)."""
    idle_s = httpx.Limits().keepalive_expiry
    assert idle_s is not None
    request = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        reader = sock.makefile("rb")
        for turn in range(2):
            sock.sendall(request)
            status = reader.readline()
            assert status.startswith(b"HTTP/1.1 200"), (turn, status)
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            reader.read(length)
            if turn == 0:
                time.sleep(idle_s + 0.5)  # idle past the client's own limit
