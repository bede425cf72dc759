"""Admission, priorities, memory promised to running requests, and the prefill pacer."""

from __future__ import annotations

from typing import Any

import pytest

from semantic.application.engine.batch_engine import BlockPoolBatchEngine, EngineConfig
from semantic.application.engine.events import CompletionEvent, EngineEvent
from semantic.application.scheduler.pacer import PacerConfig, PrefillPacer
from semantic.domain.block_pool import BlockPool
from semantic.domain.errors import QueueFullError
from semantic.domain.generation import FinishReason, Priority
from semantic.ports.model_backend import SoFar
from tests.unit.fakes import FakeBackend, FakeTokenizer
from tests.unit.step_fakes import StepBackend


def engine(capacity: int = 200, **config: Any) -> BlockPoolBatchEngine:
    settings: dict[str, Any] = {
        "prefill_chunk_tokens": 4,
        "pacer": PacerConfig(fixed_tokens=64),
        **config,
    }
    return BlockPoolBatchEngine(
        FakeBackend(), FakeTokenizer(), BlockPool(capacity), EngineConfig(**settings)
    )


def drain(e: BlockPoolBatchEngine) -> list[EngineEvent]:
    """Run to the end, giving each completion's blocks back as the server's cache would."""
    events: list[EngineEvent] = []
    while e.has_work():
        step = e.step().events
        events += step
        for event in step:
            if isinstance(event, CompletionEvent):
                e.release_blocks(event.request_id)
    return events


def finish_order(events: list[EngineEvent]) -> list[str]:
    return [e.request_id for e in events if isinstance(e, CompletionEvent)]


def first_token_order(e: BlockPoolBatchEngine) -> list[str]:
    """Run to the end; the requests in the order of their first tokens."""
    first = []
    for event in drain(e):
        if event.request_id not in first and not isinstance(event, CompletionEvent):
            first.append(event.request_id)
    return first


def test_a_high_priority_request_overtakes_queued_normal_ones() -> None:
    e = engine(max_running=1)
    first = e.submit("a", [1, 2, 3], max_tokens=3)
    e.step()  # the first one is running; the rest queue behind it
    normal = e.submit("b", [4, 5, 6], max_tokens=3, priority=Priority.NORMAL)
    low = e.submit("c", [7, 8, 9], max_tokens=3, priority=Priority.LOW)
    high = e.submit("d", [1, 5, 9], max_tokens=3, priority=Priority.HIGH)
    assert finish_order(drain(e)) == [first, high, normal, low]


def test_a_full_queue_refuses_new_requests() -> None:
    e = engine(max_waiting=2)
    e.submit("a", [1, 2], max_tokens=2)
    e.submit("b", [1, 2], max_tokens=2)
    with pytest.raises(QueueFullError) as refused:
        e.submit("c", [1, 2], max_tokens=2)
    assert refused.value.capacity == 2


def test_a_cancelled_queued_request_never_starts_and_leaks_nothing() -> None:
    e = engine(max_running=1)
    e.submit("a", [1, 2, 3], max_tokens=4)
    doomed = e.submit("b", [4, 5, 6], max_tokens=4)
    e.cancel(doomed)
    events = drain(e)
    done = {x.request_id: x for x in events if isinstance(x, CompletionEvent)}
    assert done[doomed].finish_reason is FinishReason.CANCELLED
    assert done[doomed].stats.generated_tokens == 0
    assert done[doomed].blocks is None
    assert all(
        getattr(x, "request_id", None) != doomed
        for x in events
        if not isinstance(x, CompletionEvent)
    )
    assert e.pool.used_count == 0


def test_under_a_small_pool_requests_wait_and_running_decodes_keep_their_blocks() -> None:
    e = engine(capacity=24)  # 2 layers x 12 blocks of 4 tokens: 48 positions
    ids = [e.submit(f"a{i}", [i + 1] * 6, max_tokens=10) for i in range(6)]
    events = drain(e)
    done = {x.request_id: x for x in events if isinstance(x, CompletionEvent)}
    assert set(done) == set(ids)
    assert all(x.finish_reason is FinishReason.MAX_TOKENS for x in done.values())


def test_one_slow_decode_step_does_not_widen_the_slices_but_a_slower_batch_does() -> None:
    pacer = PrefillPacer(PacerConfig(slice_ratio=2.0))
    for _ in range(20):
        pacer.observe_decode(0.027)
    pacer.observe_decode(0.076)
    assert pacer.slice_seconds() == pytest.approx(0.054)
    for _ in range(8):  # more streams joined: their steps take longer from now on
        pacer.observe_decode(0.040)
    assert pacer.slice_seconds() == pytest.approx(0.080)


def test_a_slice_gets_what_is_left_of_a_round_of_the_steps_before_the_prompt() -> None:
    pacer = PrefillPacer(PacerConfig(slice_ratio=2.0))
    for _ in range(15):
        pacer.observe_decode(0.025, batch=4)
    for _ in range(10):  # beside the prompt: slower, and not the streams' own pace
        pacer.observe_decode(0.035, batch=4, plain=False)
    assert pacer.slice_seconds(4) == pytest.approx(0.050)
    assert pacer.slice_in_round(0.050, elapsed=0.036, batch=4) == pytest.approx(0.039)
    assert pacer.slice_in_round(0.050, elapsed=0.090, batch=4) == 0.0  # one step, no more
    pacer.observe_decode(0.030, batch=5, plain=False)  # another batch: its own pace, unknown
    assert pacer.slice_seconds(5) == pytest.approx(2 * 0.035)


@pytest.mark.parametrize("batch", [4, 5])  # 5: a step of another batch forgets the plain ones
def test_a_slices_budget_is_what_the_pacer_gives_once_it_has_seen_the_rounds_step(
    batch: int,
) -> None:
    def paced() -> PrefillPacer:
        pacer = PrefillPacer(PacerConfig(slice_ratio=2.0))
        for seconds in [0.025] * 15 + [0.090] * 7:
            pacer.observe_decode(seconds, batch=4, plain=seconds < 0.05)
        return pacer

    pacer, seen = paced(), paced()
    budget = pacer.slice_budget(pacer.slice_seconds(batch), in_flight=False, batch=batch)
    given = budget(SoFar(elapsed=0.1, step_seconds=0.1, decoding=batch))
    seen.observe_decode(0.1, batch=batch, plain=False)
    planned = pacer.slice_seconds(batch)
    assert given == seen.chunk_seconds(
        planned, in_flight=False, batch=batch, round_elapsed=lambda: 0.1
    )
    assert pacer.decode_seconds == paced().decode_seconds == 0.025  # the step is not seen yet
    assert pacer.anchor(4) == paced().anchor(4)
    beside = budget(SoFar(elapsed=0.03, step_seconds=None, decoding=batch))
    assert beside == pacer.slice_in_round(planned or 0.0, 0.03, batch)


def test_streams_after_an_idle_engine_are_not_held_to_the_pace_of_earlier_ones() -> None:
    pacer = PrefillPacer(PacerConfig(slice_ratio=2.0))
    for _ in range(15):
        pacer.observe_decode(0.020, batch=4)
    pacer.observe_idle()  # then four other streams, with a long prompt beside them at once
    for _ in range(15):
        pacer.observe_decode(0.035, batch=4, plain=False)
    assert pacer.slice_seconds(4) == pytest.approx(2 * 0.035)


def test_streams_that_outgrow_their_pace_leave_a_prompt_half_its_slice() -> None:
    pacer = PrefillPacer(PacerConfig(slice_ratio=2.0))
    for _ in range(15):
        pacer.observe_decode(0.010, batch=4)
    for _ in range(15):
        pacer.observe_decode(0.030, batch=4, plain=False)
    assert pacer.slice_seconds(4) == pytest.approx(0.020)
    assert pacer.slice_in_round(0.020, elapsed=0.030, batch=4) == pytest.approx(0.010)


def test_the_pacer_gives_idle_rounds_big_chunks_and_busy_rounds_a_time_budget() -> None:
    pacer = PrefillPacer(
        PacerConfig(idle_tokens=1024, busy_tokens=None, gap_ratio=2.0, min_tokens=8)
    )
    for _ in range(6):
        for position in range(0, 4096, 512):
            for tokens in (16, 64, 256):
                pacer.observe_prefill(
                    tokens, position, 0.05 + tokens * (0.002 + 1e-6 * (position + tokens / 2))
                )
    pacer.observe_decode(0.1)
    assert pacer.round_budget(decoding=0).seconds is None
    busy = pacer.round_budget(decoding=4)
    assert busy.seconds is not None
    assert abs(busy.seconds - 0.2) < 1e-9
    c, a, b = pacer.coefficients()
    assert abs(c - 0.05) < 5e-3
    assert abs(a - 0.002) < 2e-4
    assert abs(b - 1e-6) < 2e-7
    early, late = pacer.tokens_within(0.2, 0), pacer.tokens_within(0.2, 4000)
    assert abs(pacer.cost(early, 0) - 0.2) < 0.01
    assert late < early


def test_a_short_prompt_goes_before_a_long_prompts_next_chunk() -> None:
    """QA pass 11: a 33-token request, 32 of them cached, waited 9-21 s for the whole
    prefill of long prompts admitted before it, at high priority too."""
    e = engine(pacer=PacerConfig(fixed_tokens=8))
    long_id = e.submit("long", list(range(1, 61)), max_tokens=2)
    e.step()
    queued_id = e.submit("queued", list(range(2, 62)), max_tokens=2)  # QA pass 12
    e.step()  # 16 of the first one's 60 tokens in; the second waits its turn
    short_id = e.submit("short", [7, 3, 9], max_tokens=2)
    assert first_token_order(e) == [short_id, long_id, queued_id]


def test_short_prompts_arriving_every_round_do_not_starve_a_long_one() -> None:
    e = engine(pacer=PacerConfig(fixed_tokens=8))
    long_id = e.submit("long", list(range(1, 61)), max_tokens=2)
    firsts: list[str] = []
    for n in range(40):
        e.submit(f"short-{n}", [7, 3, n + 1], max_tokens=1)
        for event in e.step().events:
            if isinstance(event, CompletionEvent):
                firsts.append(event.request_id)
                e.release_blocks(event.request_id)
    assert long_id in firsts, "the long prompt still gets every other round"


def test_an_urgent_long_prompt_is_not_held_back_for_short_ones() -> None:
    e = engine(pacer=PacerConfig(fixed_tokens=8))
    long_id = e.submit("long", list(range(1, 61)), max_tokens=2, priority=Priority.HIGH)
    e.step()
    short_id = e.submit("short", [7, 3, 9], max_tokens=2)
    assert first_token_order(e) == [long_id, short_id]


def rounds_to_first_token(priority: Priority) -> tuple[int, int]:
    """Two streams decode; a 40-token prompt of ``priority`` arrives: the rounds until its
    first token, and the decode steps of the streams meanwhile."""
    backend = FakeBackend()
    config = EngineConfig(prefill_chunk_tokens=4, pacer=PacerConfig(idle_tokens=64, busy_tokens=8))
    e = BlockPoolBatchEngine(backend, FakeTokenizer(), BlockPool(200), config)
    for n in range(2):
        e.submit(f"stream-{n}", [3 + n, 4, 5], max_tokens=40)
    e.step()
    steps = len(backend.made("step"))
    prompt_id = e.submit("prompt", list(range(1, 41)), max_tokens=2, priority=priority)
    rounds = 0
    while not any(event.request_id == prompt_id for event in e.step().events):
        rounds += 1
    return rounds + 1, len(backend.made("step")) - steps


def test_an_urgent_prompt_beside_streams_goes_unpaced_and_the_streams_still_step() -> None:
    urgent_rounds, urgent_steps = rounds_to_first_token(Priority.HIGH)
    paced_rounds, _ = rounds_to_first_token(Priority.NORMAL)
    assert urgent_rounds == 1, "the whole prompt in one round, as if nothing decoded"
    assert paced_rounds == 5, "8 tokens a round beside the streams"
    assert urgent_steps == 1, "the streams took their step in that round"


def test_an_urgent_arrival_is_admitted_before_running_prompts_go_on() -> None:
    e = engine(pacer=PacerConfig(fixed_tokens=8))
    long_id = e.submit("long", list(range(1, 61)), max_tokens=2)
    e.step()
    urgent_id = e.submit("urgent", list(range(2, 42)), max_tokens=2, priority=Priority.HIGH)
    assert first_token_order(e) == [urgent_id, long_id]


def test_an_equal_priority_is_not_urgent_short_prompts_still_go_first() -> None:
    e = engine(pacer=PacerConfig(fixed_tokens=8))
    long_id = e.submit("long", list(range(1, 61)), max_tokens=2, priority=Priority.HIGH)
    e.step()
    short_id = e.submit("short", [7, 3, 9], max_tokens=2, priority=Priority.HIGH)
    assert first_token_order(e) == [short_id, long_id]


def test_an_idle_engine_slices_a_lone_prompt_so_an_arrival_starts_within_a_round() -> None:
    """With nothing decoding, a 1,024-token pass made a request arriving meanwhile wait
    ~3 s here; sliced rounds let it in after one of them."""
    backend = StepBackend()
    pacer = PacerConfig(idle_slice_seconds=0.25, idle_tokens=8)
    config = EngineConfig(prefill_chunk_tokens=4, pacer=pacer)
    e = BlockPoolBatchEngine(backend, FakeTokenizer(), BlockPool(200), config)
    long_id = e.submit("long", list(range(1, 61)), max_tokens=2)
    e.step()
    assert [call[0] for call in backend.slices] == [long_id], "one sliced chunk, no pass"
    short_id = e.submit("short", [7, 3, 9], max_tokens=2)
    assert first_token_order(e) == [short_id, long_id]


def test_an_idle_engine_slices_a_long_prompt_to_its_last_chunk_but_not_a_short_one() -> None:
    backend = StepBackend()
    pacer = PacerConfig(idle_slice_seconds=0.25, idle_tokens=8)
    config = EngineConfig(prefill_chunk_tokens=4, pacer=pacer)
    e = BlockPoolBatchEngine(backend, FakeTokenizer(), BlockPool(200), config)
    long_id = e.submit("long", list(range(1, 11)), max_tokens=2)
    drain(e)
    finished_slices = [n for seq, n, done in backend.slices if seq == long_id and done]
    assert finished_slices == [4, 4, 2], "every chunk sliced, the last too"
    short_id = e.submit("short", [7, 3, 9], max_tokens=2)
    drain(e)
    assert all(seq != short_id for seq, _, _ in backend.slices), "a short prompt alone: a pass"
    assert (short_id, 3) in backend.fake.made("prefill")


def test_an_idle_engine_slices_a_long_prompt_with_others_queued_behind_it() -> None:
    """QA pass 12's shape: a second long prompt queued kept the rounds whole passes, and a
    short arrival waited for the pass in progress."""
    backend = StepBackend()
    pacer = PacerConfig(idle_slice_seconds=0.25, idle_tokens=8)
    config = EngineConfig(prefill_chunk_tokens=4, pacer=pacer)
    e = BlockPoolBatchEngine(backend, FakeTokenizer(), BlockPool(200), config)
    long_id = e.submit("long", list(range(1, 61)), max_tokens=2)
    queued_id = e.submit("queued", list(range(2, 62)), max_tokens=2)
    e.step()
    assert [call[0] for call in backend.slices] == [long_id], "one sliced chunk, no pass"
    assert not backend.fake.made("prefill")
    short_id = e.submit("short", [7, 3, 9], max_tokens=2)
    assert first_token_order(e) == [short_id, long_id, queued_id]


def test_the_busy_budget_gives_each_newcomer_its_share() -> None:
    pacer = PrefillPacer(PacerConfig(idle_tokens=1024, busy_tokens=64))
    assert pacer.round_budget(decoding=4, waiting=1).tokens == 64  # one long prompt, 4 streams
    assert pacer.round_budget(decoding=29, waiting=3).tokens == 64 * 3
    assert pacer.round_budget(decoding=1, waiting=31).tokens == 1024  # a burst: capped at idle


def riding_engine(ride_rows: int, **pacer: Any) -> tuple[BlockPoolBatchEngine, FakeBackend]:
    backend = FakeBackend(ride_rows=ride_rows)
    settings = {"busy_tokens": 8, "ride_ratio": 1.0, **pacer}
    config = EngineConfig(prefill_chunk_tokens=4, pacer=PacerConfig(**settings))
    return BlockPoolBatchEngine(backend, FakeTokenizer(), BlockPool(400), config), backend


def stream_then_long_prompt(e: BlockPoolBatchEngine) -> tuple[list[EngineEvent], str]:
    """Two streams decode; a 40-token prompt arrives; run to the end."""
    for n in range(2):
        e.submit(f"stream-{n}", [3 + n, 4, 5], max_tokens=30)
    events = e.step().events + e.step().events
    long_id = e.submit("long", list(range(1, 41)), max_tokens=4)
    return events + drain(e), long_id


def test_a_lone_prompt_beside_streams_rides_their_decode_steps_with_the_same_results() -> None:
    riding, ridden = riding_engine(ride_rows=32)
    events, long_id = stream_then_long_prompt(riding)
    plain, unridden = riding_engine(ride_rows=0)
    expected, _ = stream_then_long_prompt(plain)
    assert sum(n for s, n in ridden.made("ride") if s == long_id) == 40  # every prompt token rode
    assert not unridden.made("ride")
    ours = {e.agent_id: e.token_ids for e in events if isinstance(e, CompletionEvent)}
    theirs = {e.agent_id: e.token_ids for e in expected if isinstance(e, CompletionEvent)}
    assert ours == theirs


def test_a_ride_never_exceeds_the_rows_the_fused_pass_may_hold() -> None:
    e, backend = riding_engine(ride_rows=6, ride_ratio=100.0)  # time allows any chunk
    stream_then_long_prompt(e)
    assert backend.made("ride")
    assert max(n for _, n in backend.made("ride")) <= 6 - 2


def test_several_waiting_prompts_take_the_token_budget_instead_of_riding() -> None:
    e, backend = riding_engine(ride_rows=32)
    e.submit("stream", [3, 4, 5], max_tokens=30)
    e.step()
    e.step()
    e.submit("a", list(range(1, 30)), max_tokens=2)
    e.submit("b", list(range(2, 31)), max_tokens=2)
    e.step()
    assert not backend.made("ride")
    assert backend.made("prefill") or backend.made("batch")
