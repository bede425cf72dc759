"""The edge, before any routing: malformed paths, the browser checks and the API key.

Litestar's own middleware runs after a route matched, so a wrong method or an unknown path
would answer 404/405 before a key was asked for. This wrapper sits outside the router: a
path that smuggles a separator or a parent reference in percent-encoding (``%2F``,
``%5C``, ``%2E%2E``, NUL) is refused with a 400 before it can be decoded into something
else; a ``Host`` or ``Origin`` a browser attack would send is refused (``browser``); with
keys set, every route but /health and /ready answers 401 without one, whatever the method, and a key
bound to a namespace cannot name another (403); and a body that is not JSON gets a 415.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, Scope, Send

from semantic.adapters.http.browser import BrowserPolicy, json_problem
from semantic.adapters.http.dashboard_routes import PAGE_PATHS
from semantic.adapters.http.errors import Problem, body_for, headers_for, problem_for
from semantic.adapters.http.identity import (
    BOUND_NAMESPACE,
    NAMESPACE_HEADER,
    NamespaceNotAllowedError,
)
from semantic.adapters.http.keys import KeyRing
from semantic.adapters.http.request_ids import with_request_id

OPEN_PATHS = frozenset({"/health", "/ready", *PAGE_PATHS})
_REFUSED = Problem(401, "invalid_api_key", "missing or invalid API key")
_SMUGGLED = re.compile(rb"%(2f|5c|00)|%2e%2e|(^|/)\.\.(/|$)|//", re.IGNORECASE)
_BAD_PATH = Problem(400, "invalid_path", "the path holds an encoded separator or a '..' segment")
_NAMESPACE = NAMESPACE_HEADER.lower().encode()


def edge(
    app: ASGIApp,
    keys: KeyRing,
    *,
    cors_origins: tuple[str, ...] = (),
    allowed_hosts: tuple[str, ...] = (),
    on_refused: Callable[[int, str], None],
) -> ASGIApp:
    """``app`` behind the path and browser checks and, if ``keys`` holds any, the key
    check; each refusal is told to ``on_refused`` (status and code: the metrics count
    them as they count the app's own). With ``cors_origins``, a browser's preflight (an
    OPTIONS asking what it may send) passes without the key, which it never carries; the
    request it clears must carry it, and a refusal lets the page read why (else the browser
    reports a CORS failure, not a 401)."""
    allowed = frozenset(origin.encode() for origin in cors_origins)
    browser = BrowserPolicy.of(allowed_hosts, cors_origins)

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        send = with_request_id(send)
        path = scope["path"]
        headers = {k.lower(): v for k, v in scope["headers"]}
        origin = headers.get(b"origin")
        shown_to = origin if origin in allowed else None
        problem = (
            (_BAD_PATH if _SMUGGLED.search(scope.get("raw_path") or path.encode()) else None)
            or browser.host_problem(headers)
            or browser.origin_problem(scope["scheme"], headers)
        )
        asks_key = keys and path not in OPEN_PATHS and not (allowed and _preflight(scope))
        if problem is None and asks_key:
            problem, scope = _keyed(scope, headers, keys)
        problem = problem or json_problem(str(scope.get("method", "")), headers)
        if problem is not None:
            on_refused(problem.status, problem.kind)
            await _refuse(send, path, problem, shown_to)
            return
        await app(scope, receive, send)

    return guarded


def _keyed(scope: Scope, headers: dict[bytes, bytes], keys: KeyRing) -> tuple[Problem | None, Any]:
    """The key's refusal, or the scope its grant makes: a key bound to a namespace works
    there only, and a request with that key but no ``X-Namespace`` is in that namespace."""
    given = headers.get(b"x-api-key") or _bearer(headers.get(b"authorization"))
    grant = keys.grant_for(given) if given else None
    if grant is None:
        return _REFUSED, scope
    if grant.namespace is None:
        return None, scope
    bound = grant.namespace.encode()
    named = [value for key, value in scope["headers"] if key.lower() == _NAMESPACE]
    for value in named:
        if value != bound:
            refusal = NamespaceNotAllowedError(grant.namespace, value.decode("latin-1"))
            return problem_for(refusal), scope
    extra = [] if named else [(_NAMESPACE, bound)]
    state = {**scope.get("state", {}), BOUND_NAMESPACE: grant.namespace}
    return None, {**scope, "headers": [*scope["headers"], *extra], "state": state}


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
