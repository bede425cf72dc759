"""``X-Next-Agent``: any request may name the agent that runs next (an orchestrator knows
which worker it hands over to), and that agent's KV is loaded into memory in the
background while the current request runs (``AgentService.prefetch``), so its turn starts
as from memory. A name that is no agent of the request's namespace loads nothing; a
malformed one is a 400 naming the header, as for ``X-Agent-Id``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from litestar import Request

from semantic.adapters.http.identity import checked_id, identity
from semantic.adapters.http.state import ServerState
from semantic.application.agents.service import AgentService
from semantic.domain.errors import AgentNotFoundError

NEXT_AGENT_HEADER = "X-Next-Agent"

log = logging.getLogger(__name__)
_loading: set[asyncio.Task[None]] = set()
"""Prefetches under way: held so the event loop does not drop them half done."""


async def prefetch_next_agent(request: Request[Any, Any, Any]) -> None:
    """Litestar's ``before_request``: start the named agent's prefetch, answer nothing."""
    named = request.headers.get(NEXT_AGENT_HEADER)
    if not named:
        return
    agent_id = checked_id(named, NEXT_AGENT_HEADER)
    server: ServerState = request.app.state.server
    if server.services is None:
        return
    task = asyncio.create_task(
        _prefetch(server.services.agents, identity(request).namespace, agent_id)
    )
    _loading.add(task)
    task.add_done_callback(_loading.discard)


async def _prefetch(agents: AgentService, namespace: str, agent_id: str) -> None:
    with contextlib.suppress(AgentNotFoundError):
        _, loaded = await agents.prefetch(namespace, agent_id)
        log.debug("prefetched %d tokens of %s/%s", loaded, namespace, agent_id)
