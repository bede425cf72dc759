"""What the HTTP edge needs from the composition root, and the 503 until it has it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from semantic.application.agents.responses import ResponsesService
from semantic.application.agents.service import AgentService
from semantic.application.cache.store import AgentCacheStore
from semantic.application.chat.chat_turn import ChatTurns
from semantic.application.dashboard.view import Dashboard
from semantic.application.engine.events import StepResult
from semantic.application.readiness import ReadinessCheck
from semantic.domain.block_pool import BlockPool
from semantic.domain.errors import ModelUnavailableError


class Services(Protocol):
    """What the routes serve with: the use cases, and the books the dashboard and metrics
    read. No route reaches the tokenizer or the engine but through a use case."""

    @property
    def model_id(self) -> str: ...
    @property
    def agents(self) -> AgentService: ...
    @property
    def cache(self) -> AgentCacheStore: ...
    @property
    def last_step(self) -> StepResult | None:
        """The engine's last step as it reported it (requests running and waiting)."""
        ...

    @property
    def pool(self) -> BlockPool: ...
    @property
    def readiness(self) -> ReadinessCheck: ...
    @property
    def runtime(self) -> Mapping[str, Any]: ...
    @property
    def chats(self) -> ChatTurns: ...
    @property
    def responses(self) -> ResponsesService: ...
    @property
    def dashboard(self) -> Dashboard: ...


class ServerState:
    """Holds the services once the model is loaded and warmed up; until then, 503."""

    def __init__(self) -> None:
        self.services: Services | None = None
        self.failure: str | None = None

    def ready(self, services: Services) -> None:
        """The model is loaded: requests are served from now on."""
        self.services = services

    def failed(self, reason: str) -> None:
        """The model failed to load: requests are answered 503 with ``reason``."""
        self.failure = reason

    def take(self) -> Services | None:
        """The services, handed over for shutdown; requests are answered 503 again."""
        services, self.services = self.services, None
        return services

    def require(self) -> Services:
        if self.services is None:
            if self.failure is not None:
                raise ModelUnavailableError(f"the model failed to load: {self.failure}")
            raise ModelUnavailableError("the model is loading; retry shortly")
        return self.services
