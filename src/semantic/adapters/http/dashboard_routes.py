"""The dashboard: a page (no data in it, so it needs no key) and the JSON it reads.

The page's files are fixed names served from the package; every number on it comes from
``/v1/dashboard/...``, which takes the API's key like any route: a tenant's key sees its
namespace, an admin key (or a server without keys) every namespace, or one it names. The
page and its files carry a Content-Security-Policy that allows this server's own script,
style and requests, nothing inline and nothing from elsewhere (ADR 0027).
"""

from __future__ import annotations

import importlib.resources
from typing import Any, Final

from litestar import Controller, Request, Response, get
from litestar.datastructures import State

from semantic.adapters.http.common import services
from semantic.adapters.http.identity import NamespaceNotAllowedError, bound_namespace, checked_id
from semantic.adapters.http.state import Services
from semantic.application.dashboard.turn_history import MinuteSample
from semantic.application.dashboard.view import (
    AgentDetail,
    AgentRow,
    BlockView,
    NamespaceUsage,
    PageQuery,
)
from semantic.domain.errors import InvalidRequestError
from semantic.domain.generation import FinishedRequest
from semantic.domain.quotas import Quota
from semantic.ports.shared_blocks import SharedUsage

PAGE_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
PAGE_FILES: Final = {
    "index.html": "text/html",
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
}
PAGE_PATHS: Final = frozenset({"/dashboard", *(f"/dashboard/{name}" for name in PAGE_FILES)})
"""Served without a key: the page holds no data and asks for the key itself."""


def _page_file(name: str) -> Response[bytes]:
    body = importlib.resources.files(__package__).joinpath("dashboard", name).read_bytes()
    return Response(body, media_type=PAGE_FILES[name], headers=PAGE_HEADERS)


@get("/dashboard", include_in_schema=False, sync_to_thread=False)
def dashboard_page() -> Response[bytes]:
    return _page_file("index.html")


@get("/dashboard/{name:str}", include_in_schema=False, sync_to_thread=False)
def dashboard_file(name: str) -> Response[bytes]:
    if name not in PAGE_FILES:
        return Response(b"not found", status_code=404, media_type="text/plain")
    return _page_file(name)


class DashboardController(Controller):
    """What the page shows, in the asker's scope."""

    path = "/v1/dashboard"
    tags = ("Dashboard",)

    @get("/overview")
    async def overview(
        self, request: Request[Any, Any, Any], state: State, namespace: str | None = None
    ) -> dict[str, Any]:
        """The model and its fast paths, each tier's use and budget, each namespace's use."""
        found = services(state)
        scope = _scope(request, namespace)
        usage = await found.dashboard.usage(scope)
        return {
            "object": "dashboard.overview",
            "scope": {"namespaces": None if scope is None else sorted(scope)},
            "instance": found.runtime.get("instance"),
            "model": found.model_id,
            "runtime": dict(found.runtime),
            "tiers": await (_tiers(found) if scope is None else _tenant_tiers(found, usage)),
            "namespaces": [_usage(u, found.cache.quotas.of(u.namespace)) for u in usage],
        }

    @get("/agents")
    async def agents(
        self,
        request: Request[Any, Any, Any],
        state: State,
        *,
        sort: str = "last_used",
        order: str = "desc",
        offset: int = 0,
        limit: int = 50,
        search: str = "",
        anonymous: bool = False,
        namespace: str | None = None,
    ) -> dict[str, Any]:
        """A page of agents in the order asked for; ``total`` counts every page."""
        if order not in ("asc", "desc"):
            raise InvalidRequestError("order must be 'asc' or 'desc'", param="order")
        query = PageQuery(sort, order == "desc", offset, limit, search[:128], anonymous)
        page = await services(state).dashboard.agents(_scope(request, namespace), query)
        return {
            "object": "list",
            "data": [_row(row) for row in page.rows],
            "total": page.total,
            "offset": offset,
        }

    @get("/agents/{namespace:str}/{agent_id:str}")
    async def agent(
        self, request: Request[Any, Any, Any], state: State, namespace: str, agent_id: str
    ) -> dict[str, Any]:
        """One agent: its blocks by tier, lineage and last turns."""
        scope = _scope(request, checked_id(namespace, "namespace"))
        assert scope is not None  # a namespace was named
        detail = await services(state).dashboard.agent(
            next(iter(scope)), checked_id(agent_id, "agent_id")
        )
        return _detail(detail)

    @get("/history")
    async def history(
        self, request: Request[Any, Any, Any], state: State, namespace: str | None = None
    ) -> dict[str, Any]:
        """The last hour by minute: requests, time to first token, cached share."""
        minutes = services(state).dashboard.history.last_hour(_scope(request, namespace))
        return {"object": "list", "data": [_minute(m) for m in minutes]}


def _scope(request: Request[Any, Any, Any], namespace: str | None) -> frozenset[str] | None:
    """The namespaces the asker sees: its key's own, else the one it names, else all."""
    bound = bound_namespace(request)
    if bound is not None and namespace and namespace != bound:  # the header's at the edge
        raise NamespaceNotAllowedError(bound, namespace)
    if bound is not None:
        return frozenset({bound})
    if namespace:
        return frozenset({checked_id(namespace, "namespace")})
    return None


async def _tenant_tiers(found: Services, usage: list[NamespaceUsage]) -> dict[str, Any]:
    """A tenant's share of each tier: what its namespaces hold, beside the budget (other
    tenants' use is theirs to see)."""
    pool = found.pool.usage()
    return {
        "memory": {
            "used_bytes": sum(u.memory_bytes for u in usage),
            "capacity_bytes": pool.capacity * found.cache.block_bytes,
            "blocks": None,
        },
        "disk": {
            "used_bytes": sum(u.disk_bytes for u in usage),
            "quota_bytes": found.cache.disk.quota_bytes,
            "free_bytes": None,
            "refused": found.cache.disk.refused,
        },
        "shared": None if found.cache.shared_state is None else {"state": found.cache.shared_state},
        "restored_tokens": None,
    }


async def _tiers(found: Services) -> dict[str, Any]:
    """The whole instance's tiers, and the shared stores' totals (every instance's)."""
    usage = found.pool.usage()
    block_bytes = found.cache.block_bytes
    cache = found.cache
    disk = cache.disk
    stats = cache.stats
    return {
        "memory": {
            "used_bytes": usage.used * block_bytes,
            "capacity_bytes": usage.capacity * block_bytes,
            "blocks": len(cache.hot),
        },
        "disk": {
            "used_bytes": await found.dashboard.stored_bytes(),
            "database": found.runtime.get("database"),
            "quota_bytes": disk.quota_bytes,
            "free_bytes": disk.free_bytes,
            "refused": disk.refused,
        },
        "shared": None
        if cache.shared_state is None
        else {
            "state": cache.shared_state,
            **_shared_usage(await cache.shared_usage()),
            "published": stats.shared_published,
            "fetched": stats.shared_fetched,
            "missed": stats.shared_misses,
        },
        "restored_tokens": {
            "memory": stats.hot_restored_tokens,
            "disk": stats.disk_restored_tokens,
        },
    }


def _shared_usage(usage: SharedUsage | None) -> dict[str, Any]:
    """Every instance's blocks together: the tier's own totals."""
    if usage is None:
        return {"blocks": None, "used_bytes": None, "max_bytes": None}
    return {"blocks": usage.blocks, "used_bytes": usage.used_bytes, "max_bytes": usage.max_bytes}


def _usage(usage: NamespaceUsage, quota: Quota) -> dict[str, Any]:
    return {
        "namespace": usage.namespace,
        "agents": usage.agents,
        "tokens": usage.tokens,
        "memory_bytes": usage.memory_bytes,
        "disk_bytes": usage.disk_bytes,
        "quota": {
            "memory_bytes": quota.memory_bytes,
            "disk_bytes": quota.disk_bytes,
            "shared_bytes": quota.shared_bytes,
        },
    }


def _row(row: AgentRow) -> dict[str, Any]:
    return {
        "namespace": row.namespace,
        "id": row.agent_id,
        "anonymous": row.anonymous,
        "tokens": row.tokens,
        "blocks": row.blocks,
        "memory_blocks": row.memory_blocks,
        "disk_blocks": row.disk_blocks,
        "created_at": row.created_at,
        "last_used": row.last_used,
        "forked_from": row.forked_from,
        "cached_share": row.cached_share,
        "retention": row.retention.as_dict(),
    }


def _detail(detail: AgentDetail) -> dict[str, Any]:
    return {
        **_row(detail.row),
        "object": "dashboard.agent",
        "system_prompt": detail.system_prompt,
        "forks": list(detail.forks),
        "sharing_with": list(detail.sharing),
        "shared_blocks": detail.shared_blocks,
        "block_list": [_block(block) for block in detail.blocks],
        "recent_turns": [_turn(turn) for turn in reversed(detail.recent)],
    }


def _block(block: BlockView) -> dict[str, Any]:
    return {
        "key": block.key,
        "tokens": block.tokens,
        "in_memory": block.in_memory,
        "on_disk": block.on_disk,
        "holders": block.holders,
    }


def _turn(turn: FinishedRequest) -> dict[str, Any]:
    return {
        "ended_at": turn.ended_at,
        "prompt_tokens": turn.prompt_tokens,
        "cached_tokens": turn.stats.cached_tokens,
        "completion_tokens": turn.stats.generated_tokens,
        "time_to_first_token_s": turn.first_token_s,
        "seconds": turn.seconds,
    }


def _minute(sample: MinuteSample) -> dict[str, Any]:
    return {
        "start": sample.start,
        "requests": sample.requests,
        "prompt_tokens": sample.prompt_tokens,
        "cached_tokens": sample.cached_tokens,
        "hit_rate": sample.hit_rate,
        "ttft_p50_s": sample.ttft_p50_s,
        "ttft_p95_s": sample.ttft_p95_s,
    }
