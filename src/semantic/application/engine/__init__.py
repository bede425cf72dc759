"""The engine, by job: ``intake`` (requests in, cancels), ``admission`` (prefix, memory,
sequence opened), ``rounds`` (one round's plan run on the backend), ``lifecycle`` (tokens
in, requests ended, KV handed on); ``batch_engine`` wires them into one round a ``step``."""

from semantic.application.engine.admission import NO_ROOM_FAILURE, NO_ROOM_PATIENCE_S
from semantic.application.engine.batch_engine import (
    BlockPoolBatchEngine,
    EngineConfig,
    StepResult,
)

__all__ = [
    "NO_ROOM_FAILURE",
    "NO_ROOM_PATIENCE_S",
    "BlockPoolBatchEngine",
    "EngineConfig",
    "StepResult",
]
