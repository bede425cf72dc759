"""Run the engine on one dedicated thread and route its events to whoever asked.

MLX work must stay on one thread (its streams belong to the thread that made them), while
requests arrive on HTTP workers and the asyncio loop. ``EngineLoop`` owns that thread:
``submit``/``cancel``/``call`` are safe from anywhere, each request's events go to the sink
registered with it, and an asyncio caller gets them through ``AsyncEventStream``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, TypeVar

from semantic.application.engine.active_request import GenerationRequest
from semantic.application.engine.batch_engine import BlockPoolBatchEngine
from semantic.application.engine.events import CompletionEvent, EngineEvent, StepResult
from semantic.application.threads import wait_until_gone
from semantic.domain.errors import ShuttingDownError

log = logging.getLogger(__name__)

EventSink = Callable[[EngineEvent], None]
"""Called on the engine thread for each event of one request; must be quick, must not block."""

T = TypeVar("T")

SHUTDOWN_FAILURE = "the server shut down before this request finished"
"""Why a request the drain had to end failed; callers see it as ``ShuttingDownError``."""

ARRIVAL_WINDOW_S = 0.1
"""How long an idle engine waits, at most, for requests on their way before its first round:
sixteen requests sent at once took the server 35-57 ms to take in, one after another."""
ARRIVAL_QUIET_S = 0.02
"""...and how long no new request must have started its way in before that round starts,
when a fresh prompt waits (one that could share a prefill pass with the next arrival)."""


class EngineLoop:
    def __init__(
        self,
        engine: BlockPoolBatchEngine,
        *,
        on_step: Callable[[StepResult], None] | None = None,
        on_completion: Callable[[CompletionEvent], None] | None = None,
        arrival_window_s: float = ARRIVAL_WINDOW_S,
        arrival_quiet_s: float = ARRIVAL_QUIET_S,
    ) -> None:
        """``on_completion`` runs on the engine thread for every completion, before the
        request's sink; it must adopt or release the completion's blocks (by default they
        are released)."""
        self.engine = engine
        self._on_step = on_step
        self._on_completion = on_completion or (lambda e: engine.release_blocks(e.request_id))
        self._sinks: dict[str, EventSink] = {}
        self._calls: list[tuple[Callable[[], Any], Future[Any]]] = []
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._running = False
        self._stopped = False
        self._accepting = True
        self._arriving = 0
        self._last_arrival = 0.0
        self._fresh_waiting = False
        self._arrival_window_s = arrival_window_s
        self._arrival_quiet_s = arrival_quiet_s
        self.last_step: StepResult | None = None

    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._running = True
            self._thread = threading.Thread(target=self._run, name="semantic-engine", daemon=True)
            self._thread.start()

    def submit(self, sink: EventSink, request: GenerationRequest) -> str:
        """Queue ``request`` (built by ``engine.request``); its events go to ``sink``."""
        with self._lock:
            if not self._accepting:
                raise ShuttingDownError("the server is shutting down; no new requests")
            request_id = self.engine.enqueue(request)
            self._sinks[request_id] = sink
            self._fresh_waiting |= not request.continues_cached
            self._wake.notify()
        return request_id

    @contextmanager
    def arriving(self) -> Iterator[None]:
        """Around a request's way in (restore, then ``submit``): an idle engine holds its first
        round while such requests are on their way and until none has started for
        ``arrival_quiet_s`` (at most ``arrival_window_s`` in all), so agents that arrive
        together prefill together. Otherwise the first one's prompt went alone, the rest
        were prefilled in one big pass while it decoded, and its stream stalled for it (16
        agents over HTTP: first tokens 0.7-1.0 s apart). A new agent arriving alone waits the
        quiet time at most (20 ms from the start of its way in). A returning agent, whose
        prompt continues restored KV from its end, never shares a prefill pass, so it waits
        only for requests already on their way; nothing waits while requests run. A prompt
        that branches off cached KV part way (new agents whose system prompt was cached
        before) counts as new: sixteen such, over HTTP, otherwise split into a first few
        that decoded alone and the rest, whose prefill stalled them for ~1.2 s (a 2-core Zen 3
        VM; ADR 0009).

        The quiet time: sixteen requests sent at once reached this point up to 11 ms apart
        (the server parses them one at a time); with 10 ms, about one burst in four split,
        and its first agents decoded alone for ~1 s while the rest were prefilled."""
        with self._lock:
            self._arriving += 1
            self._last_arrival = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self._arriving -= 1
                self._wake.notify()

    def cancel(self, request_id: str) -> None:
        self.engine.cancel(request_id)
        with self._lock:
            self._wake.notify()

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` on the engine thread between two steps; once the loop has stopped,
        the future fails at once (``ShuttingDownError``)."""
        future: Future[T] = Future()
        with self._lock:
            if self._stopped:
                future.set_exception(ShuttingDownError("the engine has stopped"))
                return future
            self._calls.append((fn, future))
            self._wake.notify()
        return future

    def run_sync(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        if threading.current_thread() is self._thread:
            return fn()
        return self.call(fn).result(timeout)

    @property
    def active_requests(self) -> int:
        with self._lock:
            return len(self._sinks)

    def idle(self) -> bool:
        """No request running or waiting: what work beside the server waits for."""
        return self.active_requests == 0

    def drain(self, grace_s: float) -> None:
        """Stop accepting; let running requests finish for ``grace_s``, then end the rest as
        failed, so each caller hears why its reply stopped (a stream ends with an error)."""
        with self._lock:
            self._accepting = False
            pending = list(self._sinks)
        deadline = time.monotonic() + grace_s
        while self.active_requests and time.monotonic() < deadline:
            time.sleep(0.05)
        for request_id in pending:
            self.engine.cancel(request_id, SHUTDOWN_FAILURE)
        with self._lock:
            self._wake.notify()
        deadline = time.monotonic() + 30.0
        while self.active_requests and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        """The thread ended; calls it did not run fail (a caller waiting on one is told)."""
        with self._lock:
            self._running = False
            self._wake.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=30.0)
            wait_until_gone([thread.native_id])  # see threads.py
        with self._lock:
            self._stopped = True
            left, self._calls = self._calls, []
        for _, future in left:
            if future.set_running_or_notify_cancel():
                future.set_exception(ShuttingDownError("the engine stopped before running it"))

    def _run(self) -> None:
        while True:
            with self._lock:
                while self._running and not self._calls and not self.engine.has_work():
                    self._wake.wait(timeout=1.0)
                if not self._running:
                    return
                if not self._await_arrivals():
                    return  # stopped while waiting
                calls, self._calls = self._calls, []
            for fn, future in calls:
                self._run_call(fn, future)
            if self.engine.has_work():
                self._step()

    def _await_arrivals(self) -> bool:
        """With the lock held: before an idle engine's first round, let requests already on
        their way be queued, for ``arrival_window_s`` at most. False if stopped meanwhile."""
        deadline = time.monotonic() + self._arrival_window_s
        while self._running and not self.engine.running:
            now = time.monotonic()
            quiet_until = self._last_arrival + self._arrival_quiet_s
            settled = not self._fresh_waiting or now >= quiet_until
            if now >= deadline or (not self._arriving and settled):
                break
            wait_until = deadline if self._arriving else min(deadline, quiet_until)
            self._wake.wait(timeout=wait_until - now)
        self._fresh_waiting = False
        return self._running

    def _step(self) -> None:
        try:
            result = self.engine.step()
        except Exception:
            log.exception("engine step failed")
            time.sleep(0.1)
            return
        self.last_step = result
        for event in result.events:
            self._dispatch(event)
        if self._on_step is not None:
            self._on_step(result)
        if not result.events and result.decoding == 0 and result.prefilling == 0:
            with self._lock:  # queued work that cannot start yet: wait for memory to free up
                self._wake.wait(timeout=0.05)

    def _dispatch(self, event: EngineEvent) -> None:
        with self._lock:
            sink = self._sinks.get(event.request_id)
            if isinstance(event, CompletionEvent):
                self._sinks.pop(event.request_id, None)
        if isinstance(event, CompletionEvent):
            try:
                self._on_completion(event)
            except Exception:
                log.exception("completion handler failed for %s", event.request_id)
                self.engine.release_blocks(event.request_id)
        if sink is None:
            return
        try:
            sink(event)
        except Exception:
            log.exception("event sink for %s failed; cancelling it", event.request_id)
            self.engine.cancel(event.request_id)

    @staticmethod
    def _run_call(fn: Callable[[], Any], future: Future[Any]) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn())
        except BaseException as error:  # noqa: BLE001 - handed to the caller through the future
            future.set_exception(error)


class _LoopMailbox:
    """Events from the engine thread for one asyncio loop, handed over with one wake-up of
    the loop for all that arrive before it runs: a decode step of sixteen streams woke it
    sixteen times (a write to its self-pipe each, 1.3% of the engine thread's time)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[asyncio.Queue[EngineEvent], EngineEvent]] = []

    def post(self, queue: asyncio.Queue[EngineEvent], event: EngineEvent) -> None:
        with self._lock:
            self._pending.append((queue, event))
            if len(self._pending) > 1:  # a wake-up is on its way and will take this one
                return
        try:
            self._loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # the loop is closed: nobody will take these
            with self._lock:
                self._pending.clear()
            raise

    def _deliver(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for queue, event in pending:
            queue.put_nowait(event)


_mailboxes: dict[asyncio.AbstractEventLoop, _LoopMailbox] = {}
_mailboxes_lock = threading.Lock()


def _mailbox(loop: asyncio.AbstractEventLoop) -> _LoopMailbox:
    with _mailboxes_lock:
        for other in [known for known in _mailboxes if known.is_closed()]:
            del _mailboxes[other]
        return _mailboxes.setdefault(loop, _LoopMailbox(loop))


class AsyncEventStream:
    """An ``EventSink`` that hands events to an asyncio loop; iterate it for one request."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._mailbox = _mailbox(loop or asyncio.get_running_loop())
        self._queue: asyncio.Queue[EngineEvent] = asyncio.Queue()

    def __call__(self, event: EngineEvent) -> None:
        self._mailbox.post(self._queue, event)

    async def __aiter__(self) -> AsyncIterator[EngineEvent]:
        while True:
            event = await self._queue.get()
            yield event
            if isinstance(event, CompletionEvent):
                return
