"""The one generation use case every protocol goes through.

Restore the longest stored prefix, queue the request, stream safe text as it is made, and
report usage with the restored tokens. The HTTP controllers only translate their protocol
to a ``GenerationInput`` and these events back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from semantic.application.cache.lineage import ANONYMOUS_AGENT
from semantic.application.cache.store import AgentCacheStore, CachedPrefix
from semantic.application.chat.request_validation import (
    Limits,
    check_logit_bias,
    checked_max_tokens,
)
from semantic.application.engine.active_request import GenerationRequest
from semantic.application.engine.engine_loop import AsyncEventStream, EngineLoop
from semantic.application.engine.generation_handle import (
    GenerationEvent,
    GenerationFailedError,
    GenerationHandle,
    GenerationResult,
    TextDelta,
    Usage,
)
from semantic.domain.constraints import OutputConstraint
from semantic.domain.generation import GREEDY, Priority, SamplingParams, check_logprobs
from semantic.domain.tokens import reusable_prefix
from semantic.ports.observer import GenerationObserver

log = logging.getLogger(__name__)

__all__ = [  # the handle's types are part of this use case's API
    "CheckedInput",
    "GenerationEvent",
    "GenerationFailedError",
    "GenerationHandle",
    "GenerationInput",
    "GenerationResult",
    "GenerationService",
    "Limits",
    "TextDelta",
    "Usage",
]


@dataclass(frozen=True, slots=True)
class GenerationInput:
    prompt_tokens: tuple[int, ...]
    namespace: str = "default"
    agent_id: str | None = None
    max_tokens: int | None = None
    sampling: SamplingParams = GREEDY
    stop: tuple[str, ...] = ()
    priority: Priority = Priority.NORMAL
    constraint: OutputConstraint | None = None
    """What the reply must look like (JSON of a schema, tool calls); None leaves it free."""
    logprobs: int | None = None
    """Each token's log-probability with that many alternatives (``TextDelta.logprobs``,
    ``GenerationResult.logprobs``); None: none."""


@dataclass(frozen=True, slots=True)
class CheckedInput:
    """A request ``GenerationService.check`` has passed, with the max_tokens it runs with:
    handed to ``start`` it is not checked a second time."""

    request: GenerationInput
    max_tokens: int


class GenerationService:
    def __init__(
        self,
        loop: EngineLoop,
        cache: AgentCacheStore | None,
        limits: Limits,
        observer: GenerationObserver | None = None,
    ) -> None:
        self._loop = loop
        self._cache = cache
        self._limits = limits
        self._observer = observer

    @property
    def limits(self) -> Limits:
        return self._limits

    def check(self, request: GenerationInput) -> CheckedInput:
        """Refuse a request before any work (``request_validation``: once a request)."""
        max_tokens = checked_max_tokens(request.prompt_tokens, request.max_tokens, self._limits)
        check_logprobs(request.logprobs)
        check_logit_bias(request.sampling, self._limits)
        return CheckedInput(request, max_tokens)

    async def start(
        self,
        request: GenerationInput | CheckedInput,
        *,
        check: Callable[[], None] | None = None,
        on_end: Callable[[], None] | None = None,
    ) -> GenerationHandle:
        """Validate, restore the cached prefix and queue the request. Errors (bad input, a
        full queue) are raised here, before a caller commits to a streaming response.
        ``check`` and ``on_end``: the handle's (``GenerationHandle``); a ``CheckedInput``
        (from ``check``) is not checked again."""
        checked = request if isinstance(request, CheckedInput) else self.check(request)
        request, max_tokens = checked.request, checked.max_tokens
        if request.constraint is not None:  # a cold 20-tool set ~25 ms, the first ever ~0.5 s:
            # off the event loop and the engine loop's lock; a refusal comes before any work
            await asyncio.to_thread(self._loop.engine.grammar_for, request.constraint)
        prompt = request.prompt_tokens
        sink = AsyncEventStream()
        prefix = None
        try:
            with self._loop.arriving():
                started = time.monotonic()
                if self._cache is not None:
                    prefix = await self._cache.prepare(request.namespace, prompt)
                restore_s = time.monotonic() - started
                queued = self._engine_request(request, max_tokens, prefix)
                request_id = self._loop.submit(sink, queued)
        finally:
            if prefix is not None and self._cache is not None:
                self._cache.release(prefix)
        return GenerationHandle(
            request_id,
            len(prompt),
            sink,
            self._loop,
            observer=self._observer,
            cache=self._cache,
            restore_s=restore_s,
            cached_tokens=reusable_prefix(prefix.matched_tokens, len(prompt)) if prefix else 0,
            check=check,
            on_end=on_end,
        )

    def _engine_request(
        self, request: GenerationInput, max_tokens: int, prefix: CachedPrefix | None
    ) -> GenerationRequest:
        """What the engine queues: the request with the prefix found for it, typed."""
        return self._loop.engine.request(
            request.agent_id or ANONYMOUS_AGENT,
            request.prompt_tokens,
            prefix.held if prefix else None,
            stored=prefix.stored if prefix else None,
            max_tokens=max_tokens,
            sampling=request.sampling,
            stop=request.stop,
            priority=request.priority,
            namespace=request.namespace,
            constraint=request.constraint,
            logprobs=request.logprobs,
        )

    def cancel(self, request_id: str) -> None:
        """End a queued or running request at once: its stream ends as cancelled."""
        self._loop.cancel(request_id)

    async def stream(self, request: GenerationInput) -> AsyncIterator[GenerationEvent]:
        handle = await self.start(request)
        async for event in handle.events():
            yield event

    async def complete(self, request: GenerationInput) -> GenerationResult:
        async for event in self.stream(request):
            if isinstance(event, GenerationResult):
                return event
        raise GenerationFailedError("the request ended without a result")
