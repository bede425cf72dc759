"""Helpers every controller uses: the services, SSE framing, waiting for a result."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from litestar.datastructures import State
from litestar.response import Stream

from semantic.adapters.http.state import ServerState, Services
from semantic.application.generation import (
    GenerationFailedError,
    GenerationHandle,
    GenerationResult,
)


def services(state: State) -> Services:
    server: ServerState = state.server
    return server.require()


def sse_data(body: dict[str, Any], event: str | None = None) -> str:
    prefix = f"event: {event}\n" if event else ""
    return f"{prefix}data: {json.dumps(body, ensure_ascii=False)}\n\n"


def sse(iterator: AsyncIterator[str]) -> Stream:
    return Stream(
        iterator,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def result_of(handle: GenerationHandle) -> GenerationResult:
    async for event in handle.events():
        if isinstance(event, GenerationResult):
            return event
    raise GenerationFailedError("the request ended without a result")
