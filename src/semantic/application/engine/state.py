"""The tables the engine's parts share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from semantic.application.engine.active_request import ActiveRequest
from semantic.application.scheduler.request_queue import RequestQueue


@dataclass(frozen=True, slots=True)
class EngineState:
    """What every part of one engine reads and changes: the queue of waiting requests,
    the admitted ones by id (prefilling or decoding), and the engine's clock."""

    queue: RequestQueue[ActiveRequest]
    running: dict[str, ActiveRequest]
    clock: Callable[[], float]
