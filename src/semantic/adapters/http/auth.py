"""The API key, checked before routing: every route but /health, whatever the method."""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, Scope, Send

from semantic.adapters.http.errors import Problem, body_for, headers_for

OPEN_PATHS = frozenset({"/health"})
_REFUSED = Problem(401, "invalid_api_key", "missing or invalid API key")


def api_key_middleware(api_key: str) -> Callable[[ASGIApp], ASGIApp]:
    """Accepts ``Authorization: Bearer <key>`` or ``x-api-key: <key>``; anything else is a 401
    in the protocol's own error shape, before any route (or 404, or 405) is considered."""
    expected = api_key.encode()

    def wrap(app: ASGIApp) -> ASGIApp:
        async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != ScopeType.HTTP or scope["path"] in OPEN_PATHS:
                await app(scope, receive, send)
                return
            headers = {k.lower(): v for k, v in scope["headers"]}
            given = headers.get(b"x-api-key") or _bearer(headers.get(b"authorization"))
            if given is not None and hmac.compare_digest(given, expected):
                await app(scope, receive, send)
                return
            body = json.dumps(body_for(scope["path"], _REFUSED)).encode()
            extra = [(k.encode(), v.encode()) for k, v in headers_for(_REFUSED).items()]
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [(b"content-type", b"application/json"), *extra],
                }
            )
            await send({"type": "http.response.body", "body": body, "more_body": False})

        return guarded

    return wrap


def _bearer(header: bytes | None) -> bytes | None:
    if header and header[:7].lower() == b"bearer ":
        return header[7:].strip()
    return None
