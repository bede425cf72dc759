"""Helpers every controller uses: the services, SSE framing, waiting for a result."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from litestar import HttpMethod
from litestar.datastructures import State
from litestar.response import Stream
from litestar.response.base import ASGIResponse

from semantic.adapters.http.state import ServerState, Services
from semantic.application.generation import (
    GenerationFailedError,
    GenerationHandle,
    GenerationResult,
)

GET_AND_HEAD = [HttpMethod.GET, HttpMethod.HEAD]
"""Monitors and load balancers probe with HEAD too; Litestar sends the headers only."""


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


def sse(iterator: AsyncIterator[str]) -> Stream:
    return _EventStream(
        iterator,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def result_of(handle: GenerationHandle) -> GenerationResult:
    async for event in handle.events():
        if isinstance(event, GenerationResult):
            return event
    raise GenerationFailedError("the request ended without a result")
