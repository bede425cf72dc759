"""The guarded HTTP protocol on a real uvicorn server and real sockets (a tiny app, no model):
deadlines for a request's headers and body, and the connection limit."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn

from semantic.adapters.http.guarded_protocol import (
    ConnectionLimits,
    ConnectionTable,
    protocol_for,
)

REQUEST_LINE = b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\n"


class App:
    """Answers ``/`` at once; ``/hold`` only once ``release`` is set; reads bodies whole."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.disconnects = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnects += 1
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        while scope["path"] == "/hold" and not self.release.is_set():
            await asyncio.sleep(0.01)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok %d" % len(body)})


@contextmanager
def serving(limits: ConnectionLimits) -> Iterator[tuple[str, App, ConnectionTable]]:
    app = App()
    table = ConnectionTable(limits.max_connections)
    config = uvicorn.Config(app, http=protocol_for(limits, table), lifespan="off", log_config=None)
    server = uvicorn.Server(config)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server did not start")
        threading.Event().wait(0.01)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", app, table
    finally:
        app.release.set()
        server.should_exit = True
        thread.join(10)
        listener.close()


def slow_client(url: str, sent: bytes = REQUEST_LINE) -> socket.socket:
    port = int(url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    if sent:
        sock.sendall(sent)
    return sock


def answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (the socket's timeout bounds the wait)."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    sock.close()
    return received


def test_unfinished_headers_get_408_at_the_deadline() -> None:
    with serving(ConnectionLimits(8, header_timeout_s=0.3, body_timeout_s=5)) as (url, _, table):
        received = answer(slow_client(url))
        assert received.startswith(b"HTTP/1.1 408 ")
        error = json.loads(received.split(b"\r\n\r\n", 1)[1])["error"]
        assert error["code"] == "request_timeout"
        assert "request headers within 0.3 s" in error["message"]
        assert table.counts.timed_out == 1
        assert httpx.get(url).text == "ok 0", "the server goes on answering"


def test_a_connection_that_sends_nothing_is_closed_without_an_answer() -> None:
    with serving(ConnectionLimits(8, header_timeout_s=0.3, body_timeout_s=5)) as (url, _, _):
        assert answer(slow_client(url, b"")) == b""


def test_an_unfinished_body_gets_408_and_the_app_hears_the_client_is_gone() -> None:
    with serving(ConnectionLimits(8, header_timeout_s=5, body_timeout_s=0.3)) as (url, app, _):
        sock = slow_client(url, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
        received = answer(sock)
        assert received.startswith(b"HTTP/1.1 408 ")
        assert b"request body within 0.3 s" in received
        assert app.disconnects == 1
        assert httpx.post(url, content=b"x" * 100).text == "ok 100"


def test_keep_alive_requests_are_not_cut_by_the_deadlines() -> None:
    with serving(ConnectionLimits(8, header_timeout_s=5, body_timeout_s=5)) as (url, _, table):
        with httpx.Client(base_url=url) as client:
            for size in (0, 10, 100_000):
                assert client.post("/", content=b"y" * size).text == f"ok {size}"
            assert len(table) == 1, "one connection, kept alive"
        assert table.counts.timed_out == 0


def test_at_the_limit_the_slowest_request_makes_room_for_a_new_one() -> None:
    with serving(ConnectionLimits(4, header_timeout_s=30, body_timeout_s=30)) as (url, _, table):
        slow = [slow_client(url) for _ in range(4)]
        while len(table) < 4:  # each is counted once the server has taken it
            threading.Event().wait(0.01)
        assert httpx.get(url, timeout=5).text == "ok 0"
        assert table.counts.evicted == 1
        assert answer(slow[0]).startswith(b"HTTP/1.1 408 "), "the oldest went"
        for sock in slow[1:]:
            sock.close()


def test_when_every_connection_is_answering_a_new_one_is_refused_with_503() -> None:
    limits = ConnectionLimits(2, header_timeout_s=30, body_timeout_s=30)
    with serving(limits) as (url, app, table):
        held = [
            threading.Thread(target=httpx.get, args=(f"{url}/hold",), kwargs={"timeout": 10})
            for _ in range(2)
        ]
        for thread in held:
            thread.start()
        while len(table) < 2 or table.arriving:  # both requests taken, neither to be given up
            threading.Event().wait(0.01)
        refused = httpx.get(url, timeout=5)
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "too_many_connections"
        assert "--max-connections" in refused.json()["error"]["message"]
        app.release.set()
        for thread in held:
            thread.join()
        assert httpx.get(url).text == "ok 0"
