from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from semantic.application.chat.generation import GenerationInput, GenerationService, Limits
from semantic.application.engine.batch_engine import BlockPoolBatchEngine, EngineConfig
from semantic.application.engine.engine_loop import SHUTDOWN_FAILURE, AsyncEventStream, EngineLoop
from semantic.application.engine.events import CompletionEvent, EngineEvent, StepResult, TokenEvent
from semantic.domain.block_pool import BlockPool
from semantic.domain.blocks import AgentBlocks
from semantic.domain.errors import ShuttingDownError
from semantic.domain.generation import FinishReason
from tests.unit.fakes import FakeBackend, FakeTokenizer, next_token


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def loop(backend: FakeBackend) -> Iterator[EngineLoop]:
    engine_loop = EngineLoop(small_engine(backend))
    engine_loop.start()
    yield engine_loop
    engine_loop.stop()


def expected(prompt: list[int], n: int) -> list[int]:
    history, out = list(prompt), []
    for _ in range(n):
        out.append(next_token(history))
        history.append(out[-1])
    return out


async def collect(stream: AsyncEventStream) -> list[EngineEvent]:
    return [event async for event in stream]


async def test_requests_from_many_threads_stream_to_asyncio(loop: EngineLoop) -> None:
    prompts = [[i + 1, i + 2, i + 3, i + 4, i + 5] for i in range(16)]
    streams = [AsyncEventStream() for _ in prompts]

    def submit(index: int) -> None:
        loop.submit(streams[index], loop.engine.request(f"a{index}", prompts[index], max_tokens=6))

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results = await asyncio.wait_for(asyncio.gather(*(collect(s) for s in streams)), 10)
    for prompt, events in zip(prompts, results, strict=True):
        tokens = [e.token_id for e in events if isinstance(e, TokenEvent)]
        assert tokens == expected(prompt, 6)
        assert isinstance(events[-1], CompletionEvent)
    assert loop.engine.pool.used_count == 0, "unclaimed completion blocks are released"


async def test_cancel_from_another_thread_ends_the_stream(
    loop: EngineLoop, backend: FakeBackend
) -> None:
    backend.paused.set()
    stream = AsyncEventStream()
    request_id = loop.submit(stream, loop.engine.request("a", [1, 2, 3], max_tokens=100))
    canceller = threading.Thread(target=loop.cancel, args=(request_id,))
    canceller.start()
    canceller.join()
    events = await asyncio.wait_for(collect(stream), 10)
    done = events[-1]
    assert isinstance(done, CompletionEvent)
    assert done.finish_reason is FinishReason.CANCELLED


def test_calls_run_on_the_engine_thread(loop: EngineLoop) -> None:
    name = loop.call(lambda: threading.current_thread().name).result(5)
    assert name == "semantic-engine"


def test_draining_refuses_new_work_and_fails_what_outlives_the_grace_saying_why(
    loop: EngineLoop, backend: FakeBackend
) -> None:
    backend.paused.set()
    events: list[EngineEvent] = []
    loop.submit(events.append, loop.engine.request("a", [1, 2, 3], max_tokens=100))
    loop.drain(grace_s=0.2)
    done = events[-1]
    assert isinstance(done, CompletionEvent)
    assert done.finish_reason is FinishReason.ERROR
    assert done.error == SHUTDOWN_FAILURE
    with pytest.raises(ShuttingDownError):
        loop.submit(events.append, loop.engine.request("a", [1, 2], max_tokens=2))


def small_engine(backend: FakeBackend) -> BlockPoolBatchEngine:
    return BlockPoolBatchEngine(
        backend, FakeTokenizer(), BlockPool(400), EngineConfig(prefill_chunk_tokens=4)
    )


def served_agent_a(engine: BlockPoolBatchEngine) -> AgentBlocks:
    """Agent "a"'s blocks after the engine has answered its prompt [1, 2, 3, 4, 5]."""
    engine.submit(agent_id="a", prompt_tokens=[1, 2, 3, 4, 5], max_tokens=3)
    done: list[CompletionEvent] = []
    while not done:
        done += [e for e in engine.step().events if isinstance(e, CompletionEvent)]
    blocks = done[0].blocks
    assert blocks is not None
    return blocks


def loop_counting_the_first_round(
    backend: FakeBackend,
    window_s: float,
    quiet_s: float = 0.01,
    engine: BlockPoolBatchEngine | None = None,
) -> tuple[EngineLoop, list[int]]:
    """A started loop, and a list that gets how many requests its first round knew of."""
    engine = engine or small_engine(backend)
    first_round: list[int] = []

    def on_step(result: StepResult) -> None:
        if not first_round:
            first_round.append(result.decoding + result.prefilling + result.waiting)

    loop = EngineLoop(engine, on_step=on_step, arrival_window_s=window_s, arrival_quiet_s=quiet_s)
    loop.start()
    return loop, first_round


def test_an_idle_engine_waits_for_requests_on_their_way_before_its_first_round(
    backend: FakeBackend,
) -> None:
    loop, first_round = loop_counting_the_first_round(backend, window_s=30.0)
    try:
        sinks = [AsyncEventStream(asyncio.new_event_loop()) for _ in range(2)]
        with loop.arriving():  # the second agent is still on its way (restoring, say)
            with loop.arriving():
                loop.submit(sinks[0], loop.engine.request("a", [1, 2, 3], max_tokens=6))
            time.sleep(0.2)  # time enough for a round, had the engine not waited
            loop.submit(sinks[1], loop.engine.request("b", [4, 5, 6], max_tokens=6))
        while not first_round:
            loop.run_sync(lambda: None, timeout=10)
        assert first_round == [2]  # both prefilled in the first round
    finally:
        loop.stop()


def test_an_idle_engine_waits_a_moment_for_a_request_just_behind_another(
    backend: FakeBackend,
) -> None:
    loop, first_round = loop_counting_the_first_round(backend, window_s=3.0, quiet_s=1.0)
    try:
        sinks = [AsyncEventStream(asyncio.new_event_loop()) for _ in range(2)]
        with loop.arriving():
            loop.submit(sinks[0], loop.engine.request("a", [1, 2, 3], max_tokens=6))
        time.sleep(0.1)  # the next agent's request is parsed a little later
        with loop.arriving():
            loop.submit(sinks[1], loop.engine.request("b", [4, 5, 6], max_tokens=6))
        while not first_round:
            loop.run_sync(lambda: None, timeout=10)
        assert first_round == [2]
    finally:
        loop.stop()


def test_a_returning_agent_does_not_wait_the_quiet_time(backend: FakeBackend) -> None:
    """Its prompt continues restored KV, so it would not share a prefill pass anyway."""
    engine = small_engine(backend)
    blocks = served_agent_a(engine)
    rounds: list[StepResult] = []
    loop = EngineLoop(engine, on_step=rounds.append, arrival_window_s=60.0, arrival_quiet_s=60.0)
    loop.start()
    try:
        sink = AsyncEventStream(asyncio.new_event_loop())
        with loop.arriving():
            loop.submit(
                sink, loop.engine.request("a", [*blocks.token_ids, 9], blocks, max_tokens=2)
            )
        deadline = time.monotonic() + 10  # not held for the minute of quiet time
        while not rounds:
            assert time.monotonic() < deadline, "the round waited for the quiet time"
            loop.run_sync(lambda: None, timeout=10)  # a round of the loop (a call, a step)
    finally:
        loop.stop()


def test_new_agents_sharing_a_cached_opening_wait_for_each_other(backend: FakeBackend) -> None:
    """A prompt that branches off a cached sequence part way (a new agent whose system
    prompt was seen before) is a new conversation: the round waits for the burst, as for
    prompts with nothing cached, rather than starting it with whoever came first."""
    engine = small_engine(backend)
    opening = served_agent_a(engine)
    loop, first_round = loop_counting_the_first_round(backend, 3.0, 1.0, engine)
    try:
        sinks = [AsyncEventStream(asyncio.new_event_loop()) for _ in range(2)]
        for index, (agent, tail) in enumerate((("b", [7, 8]), ("c", [9, 9]))):
            request = loop.engine.request(agent, [1, 2, *tail], opening, max_tokens=2)
            assert request.cached is not None
            assert not request.continues_cached
            with loop.arriving():
                loop.submit(sinks[index], request)
            time.sleep(0.1)  # the next agent's request is parsed a little later
        while not first_round:
            loop.run_sync(lambda: None, timeout=10)
        assert first_round == [2]
    finally:
        loop.stop()


def test_events_posted_together_wake_the_loop_once_and_keep_their_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    event_loop = asyncio.new_event_loop()
    wake_ups: list[object] = []
    original = event_loop.call_soon_threadsafe

    def counting(callback: object, *args: object) -> object:
        wake_ups.append(callback)
        return original(callback, *args)  # type: ignore[arg-type]  # forwarded as given

    monkeypatch.setattr(event_loop, "call_soon_threadsafe", counting)
    streams = [AsyncEventStream(event_loop) for _ in range(3)]
    events = [TokenEvent(f"r{i % 3}", i, str(i)) for i in range(30)]

    def post_all() -> None:  # as the engine thread does after a step
        for event in events:
            streams[int(event.request_id[1:])](event)

    poster = threading.Thread(target=post_all)
    poster.start()
    poster.join()
    assert len(wake_ups) == 1  # before the loop ran: thirty events, one wake-up

    async def first(stream: AsyncEventStream, count: int) -> list[int]:
        iterator = aiter(stream)
        received = []
        for _ in range(count):
            event = await anext(iterator)
            assert isinstance(event, TokenEvent)
            received.append(event.token_id)
        await iterator.aclose()  # type: ignore[attr-defined]  # an async generator's
        return received

    try:
        got = [event_loop.run_until_complete(first(s, 10)) for s in streams]
    finally:
        event_loop.close()
    assert got == [list(range(i, 30, 3)) for i in range(3)]


async def test_a_request_the_drain_ends_fails_as_a_shutdown_not_as_a_model_failure(
    loop: EngineLoop, backend: FakeBackend
) -> None:
    """The edge answers 503 with Retry-After for it, not 500."""
    backend.paused.set()
    service = GenerationService(loop, None, Limits(512, 256, 16))
    reply = asyncio.create_task(service.complete(GenerationInput((1, 2, 3), max_tokens=100)))
    while not loop.active_requests:  # queued, before the drain starts
        await asyncio.sleep(0.01)
    await asyncio.to_thread(loop.drain, 0.2)
    with pytest.raises(ShuttingDownError, match="shut down before this request finished"):
        await reply


async def test_a_handle_closed_before_anyone_read_it_ends_its_request(
    loop: EngineLoop, backend: FakeBackend
) -> None:
    """A client that leaves before its stream's first chunk never starts ``events()``: the
    response's close must still end the request, or it generates for nobody."""
    backend.paused.set()  # never finishes on its own
    service = GenerationService(loop, None, Limits(512, 256, 16))
    ended: list[str] = []
    handle = await service.start(
        GenerationInput((1, 2, 3), max_tokens=100),
        on_end=lambda: ended.append(handle.request_id),
    )
    handle.close()
    handle.close()

    async def until_idle() -> None:
        while loop.active_requests:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(until_idle(), 10)
    assert ended == [handle.request_id]


def test_a_stopped_loop_fails_the_calls_it_will_not_run(backend: FakeBackend) -> None:
    engine_loop = EngineLoop(small_engine(backend))
    engine_loop.start()
    assert engine_loop.run_sync(lambda: threading.current_thread().name) == "semantic-engine"
    engine_loop.stop()
    with pytest.raises(ShuttingDownError):
        engine_loop.run_sync(lambda: 1, timeout=5)
