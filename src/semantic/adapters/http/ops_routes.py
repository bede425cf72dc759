"""Health (the process lives), readiness (turns can be taken now) and metrics."""

from __future__ import annotations

import contextlib
from typing import Any

from litestar import Request, Response, route
from litestar.datastructures import State

from semantic.adapters.http.common import GET_AND_HEAD
from semantic.adapters.http.identity import require_admin
from semantic.adapters.http.state import ServerState
from semantic.domain.errors import StorageUnavailableError


@route("/health", http_method=GET_AND_HEAD, tags=["Operations"], sync_to_thread=False)
def health(state: State) -> Response[dict[str, Any]]:
    """200 once the model is loaded and warmed up; 503 before (or if loading failed). While
    a full disk refuses agent turns, the status says ``degraded`` and ``storage`` why. With a
    shared block tier, ``shared_blocks`` says whether it answers (``ok``, ``unreachable``:
    still 200, the instance serves from its own tiers)."""
    server: ServerState = state.server
    if server.services is None:
        body = {"status": "failed" if server.failure else "loading", "error": server.failure}
        return Response(body, status_code=503, headers={"Retry-After": "5"})
    ok: dict[str, Any] = {"status": "ok", "model": server.services.model_id}
    disk = server.services.cache.disk
    if disk.refused is not None:  # plain requests still answer; turns are refused (507)
        ok |= {"status": "degraded", "storage": disk.refused, "disk_free_bytes": disk.free_bytes}
    if (shared := server.services.cache.shared_state) is not None:
        ok["shared_blocks"] = shared
    return Response(ok, status_code=200)


@route("/ready", http_method=GET_AND_HEAD, tags=["Operations"])
async def ready(state: State) -> Response[dict[str, Any]]:
    """Whether this instance can take an agent's turn now (what a router checks): 200, or
    503 with ``Retry-After`` and the reasons (loading, a disk that refuses transcripts, a
    metadata database that does not answer). ``/health`` stays 200 through these: the
    process lives and serves what it can."""
    server: ServerState = state.server
    if server.services is None:
        reasons = [f"model: {server.failure}" if server.failure else "model: loading"]
    else:
        reasons = list((await server.services.readiness.check()).reasons)
    if reasons:
        body = {"status": "not ready", "reasons": reasons}
        return Response(body, status_code=503, headers={"Retry-After": "5"})
    return Response({"status": "ready"}, status_code=200)


@route("/metrics", http_method=GET_AND_HEAD, tags=["Operations"])
async def metrics(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Prometheus text format (Litestar adds the charset to a text type). Each namespace's
    disk bytes are read first; with the database out of reach, that gauge is left out.
    They name every tenant's namespace and use: a key bound to one namespace gets a 403."""
    require_admin(request, "/metrics")
    server: ServerState = state.server
    disk = None
    if server.services is not None:
        with contextlib.suppress(StorageUnavailableError):
            disk = await server.services.cache.disk_by_namespace()
    return Response(state.metrics.render(disk), media_type="text/plain; version=0.0.4")
