"""A queued generation request as its reader sees it: its text as it is made, then its
result (``GenerationHandle``), and the types of what it yields."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from semantic.application.cache.store import AgentCacheStore
from semantic.application.engine.admission import NO_ROOM_FAILURE
from semantic.application.engine.engine_loop import SHUTDOWN_FAILURE, AsyncEventStream, EngineLoop
from semantic.application.engine.events import CompletionEvent, TokenEvent
from semantic.domain.errors import NoRoomCameError, SemanticError, ShuttingDownError
from semantic.domain.generation import (
    LIMITS,
    FinishedRequest,
    FinishReason,
    RequestStats,
    TokenLogprob,
)
from semantic.ports.observer import GenerationObserver

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    """The log-probabilities of the tokens whose text this is (where the request asked)."""


@dataclass(frozen=True, slots=True)
class GenerationResult:
    request_id: str
    text: str
    finish_reason: FinishReason
    usage: Usage
    stats: RequestStats
    stop_string: str | None
    logprobs: tuple[TokenLogprob, ...] = ()
    """Every shown token's log-probability, in order (where the request asked)."""


GenerationEvent = TextDelta | GenerationResult


class GenerationFailedError(SemanticError):
    """The model failed while running this request (not the caller's fault)."""


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
        self._first_token_s: float | None = None
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
        held: list[TokenLogprob] = []  # tokens whose text is not out yet
        shown: list[TokenLogprob] = []
        shown_chars = 0
        try:
            async for event in self._sink:
                if self._check is not None:
                    self._check()
                now = time.monotonic()
                if isinstance(event, TokenEvent):
                    if last is None or not event.together:
                        self._observe_token(now, last)
                    last = now
                    if event.logprob is not None:
                        held.append(event.logprob)
                    if event.text:
                        yield TextDelta(event.text, tuple(held))
                        shown += held
                        shown_chars += len(event.text)
                        held.clear()
                elif isinstance(event, CompletionEvent):
                    self._finished = True
                    if self._cache is not None:  # acknowledge only what is on disk
                        await self._cache.saved(self.request_id)
                    self._log(event)
                    if self._observer is not None:
                        self._observer.on_finished(self._finished_request(event, now))
                    if len(event.text) > shown_chars:  # released at the end, unstreamed
                        shown += held
                    elif held and event.finish_reason in LIMITS:
                        yield TextDelta("", tuple(held))  # a character the limit cut short
                        shown += held
                    yield _result(event, tuple(shown))
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

    def _finished_request(self, event: CompletionEvent, now: float) -> FinishedRequest:
        return FinishedRequest(
            event.namespace,
            event.agent_id,
            event.prompt_tokens,
            event.stats,
            now - self._started,
            self._first_token_s,
            time.time(),
        )

    def _observe_token(self, now: float, last: float | None) -> None:
        if last is None:
            self._first_token_s = now - self._started
        if self._observer is None:
            return
        if last is None:
            self._observer.on_first_token(now - self._started)
        else:
            self._observer.on_token_gap(now - last)


def _result(event: CompletionEvent, logprobs: tuple[TokenLogprob, ...]) -> GenerationResult:
    if event.finish_reason is FinishReason.ERROR and event.error == SHUTDOWN_FAILURE:
        raise ShuttingDownError(SHUTDOWN_FAILURE)
    if event.finish_reason is FinishReason.ERROR and event.error == NO_ROOM_FAILURE:
        raise NoRoomCameError(NO_ROOM_FAILURE)
    if event.finish_reason is FinishReason.ERROR:
        raise GenerationFailedError(f"generation failed: {event.error or 'unknown error'}")
    usage = Usage(event.prompt_tokens, event.stats.generated_tokens, event.stats.cached_tokens)
    return GenerationResult(
        event.request_id,
        event.text,
        event.finish_reason,
        usage,
        event.stats,
        event.stop_string,
        logprobs,
    )
