"""The engine, by job: ``intake`` (requests in, cancels), ``admission`` (prefix, memory,
sequence opened), ``rounds`` (one round's plan run on the backend), ``lifecycle`` (tokens
in, requests ended, KV handed on); ``batch_engine`` wires them into one round a ``step``.
Around it: ``engine_loop`` (its one thread, and events routed to their readers),
``active_request`` (a request's record), ``completion`` and ``detokenizer`` (when a stream
ends, and its safe text), ``events`` and ``generation_handle`` (what a reader sees), and
``prefix_sharing`` (a running request's prefix copied, not recomputed)."""

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
