"""The edge, before any routing: malformed paths and the API key.

Litestar's own middleware runs after a route matched, so a wrong method or an unknown path
would answer 404/405 before a key was asked for. This wrapper sits outside the router: with
a key set, every route but /health answers 401 without it, whatever the method; and a path
that smuggles a separator or a parent reference in percent-encoding (``%2F``, ``%5C``,
``%2E%2E``, NUL) is refused with a 400 before it can be decoded into something else.
"""

from __future__ import annotations

import hmac
import json
import re

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, Scope, Send

from semantic.adapters.http.errors import Problem, body_for, headers_for

OPEN_PATHS = frozenset({"/health"})
_REFUSED = Problem(401, "invalid_api_key", "missing or invalid API key")
_SMUGGLED = re.compile(rb"%(2f|5c|00)|%2e%2e|(^|/)\.\.(/|$)|//", re.IGNORECASE)
_BAD_PATH = Problem(400, "invalid_path", "the path holds an encoded separator or a '..' segment")


def edge(app: ASGIApp, api_key: str | None, *, cors_origins: tuple[str, ...] = ()) -> ASGIApp:
    """``app`` behind the path check and, if ``api_key`` is set, the key check. With
    ``cors_origins``, a browser's preflight (an OPTIONS asking what it may send) passes
    without the key, which it never carries; the request it clears must carry it, and a
    refusal lets the page read why (else the browser reports a CORS failure, not a 401)."""
    expected = api_key.encode() if api_key else None
    allowed = frozenset(origin.encode() for origin in cors_origins)

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        path = scope["path"]
        headers = {k.lower(): v for k, v in scope["headers"]}
        origin = headers.get(b"origin")
        shown_to = origin if origin in allowed else None
        if _SMUGGLED.search(scope.get("raw_path") or path.encode()):
            await _refuse(send, path, _BAD_PATH, shown_to)
            return
        if expected is not None and path not in OPEN_PATHS and not (allowed and _preflight(scope)):
            given = headers.get(b"x-api-key") or _bearer(headers.get(b"authorization"))
            if given is None or not hmac.compare_digest(given, expected):
                await _refuse(send, path, _REFUSED, shown_to)
                return
        await app(scope, receive, send)

    return guarded


async def _refuse(send: Send, path: str, problem: Problem, origin: bytes | None) -> None:
    body = json.dumps(body_for(path, problem)).encode()
    extra = [(k.encode(), v.encode()) for k, v in headers_for(problem).items()]
    if origin is not None:
        extra += [(b"access-control-allow-origin", origin), (b"vary", b"Origin")]
    await send(
        {
            "type": "http.response.start",
            "status": problem.status,
            "headers": [(b"content-type", b"application/json"), *extra],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _preflight(scope: Scope) -> bool:
    names = {k.lower() for k, _ in scope["headers"]}
    return scope.get("method") == "OPTIONS" and b"access-control-request-method" in names


def _bearer(header: bytes | None) -> bytes | None:
    if header and header[:7].lower() == b"bearer ":
        return header[7:].strip()
    return None
