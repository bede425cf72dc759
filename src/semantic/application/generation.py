"""The one generation use case every protocol goes through.

Restore the longest stored prefix, queue the request, stream safe text as it is made, and
report usage with the restored tokens. The HTTP controllers only translate their protocol
to a ``GenerationInput`` and these events back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass

from semantic.application.cache.lineage import ANONYMOUS_AGENT
from semantic.application.cache.store import AgentCacheStore
from semantic.application.engine import NO_ROOM_FAILURE
from semantic.application.engine_loop import SHUTDOWN_FAILURE, AsyncEventStream, EngineLoop
from semantic.application.events import CompletionEvent, TokenEvent
from semantic.domain.constraints import OutputConstraint
from semantic.domain.errors import (
    InvalidRequestError,
    NoRoomCameError,
    PromptTooLongError,
    SemanticError,
    ShuttingDownError,
)
from semantic.domain.generation import GREEDY, FinishReason, Priority, RequestStats, SamplingParams
from semantic.domain.tokens import reusable_prefix
from semantic.ports.observer import GenerationObserver

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Limits:
    max_context: int
    max_tokens_cap: int
    default_max_tokens: int


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


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class GenerationResult:
    request_id: str
    text: str
    finish_reason: FinishReason
    usage: Usage
    stats: RequestStats
    stop_string: str | None


GenerationEvent = TextDelta | GenerationResult


class GenerationFailedError(SemanticError):
    """The model failed while running this request (not the caller's fault)."""


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

    def check(self, request: GenerationInput) -> int:
        """Refuse a request before any work; returns the max_tokens it will run with."""
        max_tokens = request.max_tokens
        if max_tokens is None:
            max_tokens = self._limits.default_max_tokens
        if not 0 < max_tokens <= self._limits.max_tokens_cap:
            raise InvalidRequestError(
                f"max_tokens must be between 1 and {self._limits.max_tokens_cap}, got {max_tokens}",
                param="max_tokens",
            )
        if not request.prompt_tokens:
            raise InvalidRequestError("the prompt is empty", param="messages")
        if len(request.prompt_tokens) >= self._limits.max_context:
            raise PromptTooLongError(
                f"the prompt is {len(request.prompt_tokens)} tokens; the model's context is "
                f"{self._limits.max_context}",
                param="messages",
            )
        if len(request.prompt_tokens) + max_tokens > self._limits.max_context:
            max_tokens = self._limits.max_context - len(request.prompt_tokens)
            if request.max_tokens is not None:
                raise PromptTooLongError(
                    f"the prompt ({len(request.prompt_tokens)} tokens) plus max_tokens "
                    f"({request.max_tokens}) exceeds the model's context of "
                    f"{self._limits.max_context}",
                    param="max_tokens",
                )
        return max_tokens

    async def start(
        self,
        request: GenerationInput,
        *,
        check: Callable[[], None] | None = None,
        on_end: Callable[[], None] | None = None,
    ) -> GenerationHandle:
        """Validate, restore the cached prefix and queue the request. Errors (bad input, a
        full queue) are raised here, before a caller commits to a streaming response.
        ``check`` and ``on_end``: the handle's (``GenerationHandle``)."""
        max_tokens = self.check(request)
        if request.constraint is not None:  # a cold 20-tool set ~25 ms, the first ever ~0.5 s:
            # off the event loop and the engine loop's lock; a refusal comes before any work
            await asyncio.to_thread(self._loop.engine.grammar_for, request.constraint)
        prompt = request.prompt_tokens
        agent_id = request.agent_id or ANONYMOUS_AGENT
        sink = AsyncEventStream()
        prefix = None
        try:
            with self._loop.arriving():
                started = time.monotonic()
                if self._cache is not None:
                    prefix = await self._cache.prepare(request.namespace, prompt)
                restore_s = time.monotonic() - started
                queued = self._loop.engine.request(
                    agent_id,
                    prompt,
                    prefix.blocks if prefix else None,
                    stored=prefix.stored if prefix else None,
                    max_tokens=max_tokens,
                    sampling=request.sampling,
                    stop=request.stop,
                    priority=request.priority,
                    namespace=request.namespace,
                    constraint=request.constraint,
                )
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


class GenerationHandle:
    """A queued request: iterate ``events()`` for its text and result. Leaving the iteration
    early (a client that went away) cancels the request and frees its blocks."""

    def __init__(
        self,
        request_id: str,
        prompt_tokens: int,
        sink: AsyncEventStream,
        loop: EngineLoop,
        *,
        observer: GenerationObserver | None,
        cache: AgentCacheStore | None,
        restore_s: float = 0.0,
        cached_tokens: int = 0,
        check: Callable[[], None] | None = None,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        """``check`` is called before each event is passed on: it raises to end the
        request (its agent was deleted, say). ``on_end`` is called once, when the request
        is over for its reader (``close``)."""
        self.request_id = request_id
        self.cached_tokens = cached_tokens
        """Prompt tokens restored rather than computed, known before the first token (the
        engine feeds the last prompt token even on a full hit, as it counts it)."""
        self._restore_s = restore_s
        self._cache = cache
        self.prompt_tokens = prompt_tokens
        self._sink = sink
        self._loop = loop
        self._observer = observer
        self._started = time.monotonic()
        self._check = check
        self._on_end = on_end
        self._finished = False
        self._closed = False

    def close(self) -> None:
        """Ends the request for its reader: cancels it unless it finished, once. ``events()``
        calls it as it ends; a streamed response calls it too, since a stream cancelled before
        its first step never starts ``events()``, and its request would otherwise generate
        to the end for nobody and keep its agent's turn open."""
        if self._closed:
            return
        self._closed = True
        if not self._finished:
            self._loop.cancel(self.request_id)
            if self._observer is not None:
                self._observer.on_abandoned()
        if self._on_end is not None:
            self._on_end()

    async def events(self) -> AsyncGenerator[GenerationEvent, None]:
        last: float | None = None
        try:
            async for event in self._sink:
                if self._check is not None:
                    self._check()
                now = time.monotonic()
                if isinstance(event, TokenEvent):
                    self._observe_token(now, last)
                    last = now
                    if event.text:
                        yield TextDelta(event.text)
                elif isinstance(event, CompletionEvent):
                    self._finished = True
                    if self._cache is not None:  # acknowledge only what is on disk
                        await self._cache.saved(self.request_id)
                    self._log(event)
                    if self._observer is not None:
                        self._observer.on_finished(
                            event.stats, event.prompt_tokens, now - self._started
                        )
                    yield _result(event)
        finally:
            self.close()

    def _log(self, event: CompletionEvent) -> None:
        """Where a request's time went (no text: prompts and replies stay out of logs)."""
        stats = event.stats
        log.info(
            "%s %s: restore %.0f ms, queue and cache build %.0f ms, prefill %d tokens %.0f ms "
            "(%d cached), decode %d tokens %.0f ms, total %.0f ms",
            self.request_id,
            event.finish_reason.value,
            self._restore_s * 1e3,
            stats.queued_s * 1e3,
            stats.computed_tokens,
            stats.prefill_s * 1e3,
            stats.cached_tokens,
            stats.generated_tokens,
            stats.decode_s * 1e3,
            (time.monotonic() - self._started + self._restore_s) * 1e3,
        )

    def _observe_token(self, now: float, last: float | None) -> None:
        if self._observer is None:
            return
        if last is None:
            self._observer.on_first_token(now - self._started)
        else:
            self._observer.on_token_gap(now - last)


def _result(event: CompletionEvent) -> GenerationResult:
    if event.finish_reason is FinishReason.ERROR and event.error == SHUTDOWN_FAILURE:
        raise ShuttingDownError(SHUTDOWN_FAILURE)
    if event.finish_reason is FinishReason.ERROR and event.error == NO_ROOM_FAILURE:
        raise NoRoomCameError(NO_ROOM_FAILURE)
    if event.finish_reason is FinishReason.ERROR:
        raise GenerationFailedError(f"generation failed: {event.error or 'unknown error'}")
    usage = Usage(event.prompt_tokens, event.stats.generated_tokens, event.stats.cached_tokens)
    return GenerationResult(
        event.request_id, event.text, event.finish_reason, usage, event.stats, event.stop_string
    )
