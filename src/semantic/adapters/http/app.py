"""The Litestar application: routes, errors in each protocol's shape, the API keys, limits.

The app starts answering at once (``/health`` says 503) while the composition root loads
and warms the model in the background; then it serves. On shutdown it hands control back to
the composition root to drain requests and flush saves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from litestar import Litestar
from litestar.config.cors import CORSConfig
from litestar.openapi import OpenAPIConfig
from litestar.types import ASGIApp

from semantic import __version__
from semantic.adapters.http import errors
from semantic.adapters.http.agent_routes import AgentController
from semantic.adapters.http.anthropic_routes import AnthropicController
from semantic.adapters.http.auth import edge
from semantic.adapters.http.conversation_routes import ConversationController
from semantic.adapters.http.dashboard_routes import (
    DashboardController,
    dashboard_file,
    dashboard_page,
)
from semantic.adapters.http.keys import KeyRing, keyring
from semantic.adapters.http.metrics import Metrics
from semantic.adapters.http.namespace_routes import NamespaceController
from semantic.adapters.http.next_agent import prefetch_next_agent
from semantic.adapters.http.openai_routes import OpenAIController
from semantic.adapters.http.ops_routes import health, metrics, ready
from semantic.adapters.http.responses_routes import ResponsesController
from semantic.adapters.http.state import ServerState, Services

log = logging.getLogger(__name__)

Start = Callable[[Metrics], Awaitable[Services]]
Stop = Callable[[Services], Awaitable[None]]


def create_app(
    start: Start,
    stop: Stop,
    *,
    api_key: str | None = None,
    max_body_bytes: int = 4 << 20,
    cors_origins: tuple[str, ...] = (),
    keys: KeyRing | None = None,
    allowed_hosts: tuple[str, ...] = (),
) -> ASGIApp:
    """``start`` builds the services (load the model, open storage); ``stop`` drains them.
    ``keys`` (else ``api_key``, an admin key) are the keys asked for; ``allowed_hosts``
    the names besides loopback ones and addresses a ``Host`` header may give."""
    state = ServerState()
    observer = Metrics(state)

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        loading = asyncio.create_task(_load(state, start, observer))
        try:
            yield
        finally:
            if not loading.done():
                loading.cancel()
                await asyncio.gather(loading, return_exceptions=True)
            services = state.take()
            if services is not None:
                await stop(services)

    app = app_for(state, observer, lifespan, max_body_bytes, cors_origins)
    ring = keys if keys is not None else keyring(api_key, None)
    return edge(
        app,
        ring,
        cors_origins=cors_origins,
        allowed_hosts=allowed_hosts,
        on_refused=observer.on_refused,
    )


def app_for(
    state: ServerState,
    observer: Metrics,
    lifespan: Any,
    max_body_bytes: int,
    cors_origins: tuple[str, ...] = (),
) -> Litestar:
    cors = None
    if cors_origins:  # the headers clients send: the SDKs' own, ours, and the key's
        cors = CORSConfig(allow_origins=list(cors_origins), allow_headers=["*"])
    return Litestar(
        cors_config=cors,
        route_handlers=[
            OpenAIController,
            AnthropicController,
            AgentController,
            ResponsesController,
            ConversationController,
            DashboardController,
            NamespaceController,
            dashboard_page,
            dashboard_file,
            health,
            ready,
            metrics,
        ],
        lifespan=[lifespan],
        before_request=prefetch_next_agent,
        exception_handlers={Exception: errors.handle},
        request_max_body_size=max_body_bytes,
        state=_app_state(state, observer),
        openapi_config=OpenAPIConfig(title="semantic", version=__version__),
        debug=False,
        logging_config=None,  # the CLI's handler stays: one format, repeated lines counted
    )


async def _load(state: ServerState, start: Start, observer: Metrics) -> None:
    try:
        services = await start(observer)
        state.ready(services)
        log.info("ready: serving %s", services.model_id)
    except asyncio.CancelledError:
        raise
    except Exception as error:
        state.failed(f"{type(error).__name__}: {error}")
        log.exception("the model failed to load")


def _app_state(state: ServerState, observer: Metrics) -> Any:
    from litestar.datastructures import State

    return State({"server": state, "metrics": observer})
