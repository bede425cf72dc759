"""Helpers every controller uses: the services, SSE framing, waiting for a result."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from litestar import HttpMethod, Request
from litestar.background_tasks import BackgroundTask
from litestar.datastructures import State
from litestar.response import Stream
from litestar.response.base import ASGIResponse

from semantic.adapters.http.state import ServerState, Services
from semantic.application.chat.chat_reply import ChatOutcome, ChatReply
from semantic.domain.errors import SemanticError

T = TypeVar("T")
log = logging.getLogger(__name__)

GET_AND_HEAD = [HttpMethod.GET, HttpMethod.HEAD]
"""Monitors and load balancers probe with HEAD too (uvicorn sends a HEAD's headers only)."""


def services(state: State) -> Services:
    server: ServerState = state.server
    return server.require()


def sse_data(body: dict[str, Any], event: str | None = None) -> str:
    prefix = f"event: {event}\n" if event else ""
    return f"{prefix}data: {json.dumps(body, ensure_ascii=False)}\n\n"


class _EventStream(Stream):
    """A ``Stream`` that keeps its own media type. Litestar 2 lets the route's media type
    win over the response's (``Stream.to_asgi_response``), and routes that answer JSON or
    a stream have JSON's: the stream went out as ``application/json``, which ``EventSource``
    and ``httpx-sse`` refuse."""

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> ASGIResponse:
        kwargs["media_type"] = self.media_type
        return super().to_asgi_response(*args, **kwargs)


def sse(iterator: AsyncIterator[str], on_close: Callable[[], Any]) -> Stream:
    """``on_close`` ends the generation behind ``iterator`` once the response is over:
    Litestar cancels the streaming task when the client disconnects, and if that lands
    before the task's first step, ``iterator`` is never started and its own cleanup never
    runs."""
    return _EventStream(
        iterator,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        background=BackgroundTask(on_close),
    )


class ClientGoneError(SemanticError):
    """The client went away before its reply was ready (nobody reads the answer)."""


async def unless_client_leaves(request: Request[Any, Any, Any], work: Awaitable[T]) -> T:
    """``work``'s result, or ``ClientGoneError`` once the client disconnects. Cancelling
    the work ends its generation at the next step and frees its blocks; an agent's turn is
    then never committed. (A stream's response watches for this itself; a plain reply is
    only written at the end, so without this a client that timed out and retried, as SDKs
    do, left its first request generating to the end, and the agent's transcript with a
    turn the client never saw.)"""
    job = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({job, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not job.done():
            job.cancel()
    if gone.done() and not gone.cancelled() and gone.exception() is not None:
        log.warning("watching for a disconnect failed: %s", gone.exception())
    if not job.done() or job.cancelled():
        await asyncio.gather(job, return_exceptions=True)  # its cancellation runs to its end
        raise ClientGoneError("the client went away before its reply")
    return job.result()


async def _disconnected(request: Request[Any, Any, Any]) -> None:
    """Once the body is read, the server's next message is the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def result_of(request: Request[Any, Any, Any], reply: ChatReply) -> ChatOutcome:
    """The whole reply, unless the client leaves first (``unless_client_leaves``)."""
    return await unless_client_leaves(request, reply.outcome())
