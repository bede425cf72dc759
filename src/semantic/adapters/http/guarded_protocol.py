"""uvicorn's HTTP/1.1 protocol with deadlines for a request's arrival and a bounded number of
connections.

uvicorn gives a connection no deadline until its request has been read: a client that sends
a request line and never finishes its headers, or never finishes its body, holds a
descriptor for as long as it likes. 2,300 such sockets once held the server at its
descriptor limit, where nothing else could connect and a KV save failed with EMFILE
(issue 32). Here each request must arrive in time (headers, then body, each with its own
deadline, counted from when it began, so trickling a byte now and then does not extend
it), and the connections are counted: at the limit, the connection that has been sending
its request the longest is given up to make room (a client that sends a request at once is
never that one); only when every connection holds a request being answered is the new one
refused, with a 503 that says why.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

log = logging.getLogger(__name__)

LINGER_S = 1.0
"""How long a refused connection may stay open to read its 503 before it is cut."""
MAX_LINGERING = 64
"""Refused connections allowed to linger at once; past that a refusal closes at once."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int = 1024
    header_timeout_s: float = 10.0
    """From the connection's start (or the previous response's end) to the request's last
    header line."""
    body_timeout_s: float = 30.0
    """From the last header line to the body's last byte."""

    def __post_init__(self) -> None:
        if self.max_connections <= 0:
            raise ValueError("max_connections must be positive")
        if not (self.header_timeout_s > 0 and self.body_timeout_s > 0):
            raise ValueError("header_timeout_s and body_timeout_s must be positive")


class Phase(enum.Enum):
    HEADERS = "its request headers"
    BODY = "its request body"
    ANSWERING = "its answer"


_PHASES = {h11.IDLE: Phase.HEADERS, h11.SEND_BODY: Phase.BODY}


@dataclass(slots=True)
class ConnectionCounts:
    """What the limits did, since the start: for the log and the reliability suite."""

    evicted: int = 0
    refused: int = 0
    timed_out: int = 0


class ConnectionTable:
    """The open connections of one server, and among them those still sending a request,
    in the order they began to: the first to be given up when a new connection needs room
    (those still sending headers before those sending a body)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.counts = ConnectionCounts()
        self.lingering = 0
        self._open: set[GuardedH11Protocol] = set()
        self._arriving: dict[Phase, dict[GuardedH11Protocol, None]] = {
            Phase.HEADERS: {},
            Phase.BODY: {},
        }

    def __len__(self) -> int:
        return len(self._open)

    @property
    def arriving(self) -> int:
        """Connections whose request is still arriving (or whose next one has not begun)."""
        return sum(len(arriving) for arriving in self._arriving.values())

    def admit(self, connection: GuardedH11Protocol) -> bool:
        """Whether ``connection`` may stay; at the limit, the longest-arriving request's
        connection is given up for it, if there is one."""
        if len(self._open) >= self.capacity:
            victim = self._oldest_arriving()
            if victim is None:
                self.counts.refused += 1
                return False
            self.counts.evicted += 1
            victim.give_up()
        self._open.add(connection)
        return True

    def enter(self, connection: GuardedH11Protocol, phase: Phase) -> None:
        for arriving in self._arriving.values():
            arriving.pop(connection, None)
        if phase in self._arriving:
            self._arriving[phase][connection] = None

    def remove(self, connection: GuardedH11Protocol) -> None:
        self._open.discard(connection)
        self.enter(connection, Phase.ANSWERING)

    def _oldest_arriving(self) -> GuardedH11Protocol | None:
        for phase in (Phase.HEADERS, Phase.BODY):
            for connection in self._arriving[phase]:
                return connection
        return None


class GuardedH11Protocol(H11Protocol):
    """One connection: uvicorn's h11 protocol, admitted by a ``ConnectionTable`` and held
    to the ``ConnectionLimits`` deadlines while its request arrives."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        limits: ConnectionLimits,
        table: ConnectionTable,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._limits = limits
        self._table = table
        self._phase: Phase | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(  # type: ignore[override]  # uvicorn's own narrower signature
        self, transport: asyncio.Transport
    ) -> None:
        super().connection_made(transport)
        if self._table.admit(self):
            self._track()
        else:
            self._refuse()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        if self._refused:
            self._table.lingering -= 1
        else:
            self._table.remove(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # its answer is already written; what it sends is not read
        super().data_received(data)
        self._track()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._track()

    def give_up(self) -> None:
        """Close this connection to make room: its request has been the slowest to come."""
        self._table.remove(self)
        phase = self._phase or Phase.HEADERS
        log.warning(
            "at the connection limit: closed the connection sending %s the longest", phase.value
        )
        self._close_for(
            f"a new connection needed the room while it was still sending {phase.value}"
        )

    def _track(self) -> None:
        """Start the deadline of the request's part now arriving, when a new part begins."""
        if self.transport.is_closing():
            return
        phase = _PHASES.get(self.conn.their_state, Phase.ANSWERING)
        if phase is self._phase:
            return
        self._phase = phase
        self._cancel_deadline()
        self._table.enter(self, phase)
        timeout = {
            Phase.HEADERS: self._limits.header_timeout_s,
            Phase.BODY: self._limits.body_timeout_s,
        }.get(phase)
        if timeout is not None:
            self._deadline = self.loop.call_later(timeout, self._expire, phase, timeout)

    def _expire(self, phase: Phase, timeout: float) -> None:
        self._deadline = None
        self._table.counts.timed_out += 1
        self._table.remove(self)
        log.warning("closed a connection that did not send %s within %g s", phase.value, timeout)
        self._close_for(f"it did not send {phase.value} within {timeout:g} s")

    def _close_for(self, reason: str) -> None:
        """Answer 408 where the client is waiting for an answer, and close."""
        self._cancel_deadline()
        if self.transport.is_closing():
            return
        started = self._phase is Phase.BODY or bool(self.conn.trailing_data[0])
        answering = self.cycle is not None and self.cycle.response_started
        if started and not answering and self._phase is not Phase.ANSWERING:
            self.transport.write(_plain_response(408, "Request Timeout", "request_timeout", reason))
        self.transport.close()

    def _refuse(self) -> None:
        """Every connection holds a request being answered: say so, then close soon."""
        self._refused = True
        self._table.lingering += 1
        log.warning(
            "refused a connection: all %d hold requests being answered", self._table.capacity
        )
        message = (
            f"the server holds its limit of {self._table.capacity} connections "
            "(--max-connections), each answering a request; retry shortly"
        )
        self.transport.write(
            _plain_response(
                503, "Service Unavailable", "too_many_connections", message, retry_after=1
            )
        )
        if self._table.lingering > MAX_LINGERING:
            self.transport.close()
            return
        # Closing with the client's request unread would reset the connection and could
        # lose the answer: shut our side, let it read, cut it after a moment.
        self.transport.write_eof()
        self._deadline = self.loop.call_later(LINGER_S, self.transport.abort)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None


def _plain_response(
    status: int, reason: str, code: str, message: str, retry_after: int | None = None
) -> bytes:
    """A whole response, written before (or instead of) the app's: an OpenAI-shaped error."""
    body = json.dumps(
        {
            "error": {
                "message": message,
                "type": "server_error" if status >= 500 else "invalid_request_error",
                "param": None,
                "code": code,
            }
        }
    ).encode()
    head = [
        f"HTTP/1.1 {status} {reason}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
    ]
    if retry_after is not None:
        head.append(f"retry-after: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def protocol_for(limits: ConnectionLimits, table: ConnectionTable) -> type[H11Protocol]:
    """The protocol class to give uvicorn (it builds each connection's protocol itself, from
    its config alone), bound to ``limits`` and to the table counting its connections."""

    class BoundProtocol(GuardedH11Protocol):
        def __init__(
            self,
            config: Config,
            server_state: ServerState,
            app_state: dict[str, Any],
            _loop: asyncio.AbstractEventLoop | None = None,
        ) -> None:
            super().__init__(config, server_state, app_state, _loop, limits=limits, table=table)

    return BoundProtocol
