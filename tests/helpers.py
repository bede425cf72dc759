"""Drive an engine (real or on fakes) to completion from a test."""

from __future__ import annotations

from semantic.application.engine import BlockPoolBatchEngine
from semantic.application.events import CompletionEvent, EngineEvent


def run_until_idle(engine: BlockPoolBatchEngine, limit: int = 10_000) -> list[EngineEvent]:
    events: list[EngineEvent] = []
    for _ in range(limit):
        if not engine.has_work():
            return events
        events += engine.step().events
    raise AssertionError("engine did not go idle")


def completions(events: list[EngineEvent]) -> dict[str, CompletionEvent]:
    return {e.request_id: e for e in events if isinstance(e, CompletionEvent)}


def generate(
    engine: BlockPoolBatchEngine, prompt: list[int], n: int, **kwargs: object
) -> CompletionEvent:
    request_id = engine.submit("test", prompt, max_tokens=n, **kwargs)  # type: ignore[arg-type]  # test passthrough
    return completions(run_until_idle(engine))[request_id]
