from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from semantic.application.books.kv_books import HEAD_PIN_PATIENCE_S
from semantic.application.engine.active_request import StoredPrefix
from semantic.application.engine.admission import NO_ROOM_FAILURE, NO_ROOM_PATIENCE_S
from semantic.application.engine.batch_engine import BlockPoolBatchEngine, EngineConfig
from semantic.application.engine.events import CompletionEvent, EngineEvent, TokenEvent
from semantic.application.scheduler.pacer import PacerConfig
from semantic.domain.block_pool import BlockPool
from semantic.domain.blocks import AgentBlocks
from semantic.domain.generation import FinishReason
from semantic.ports.model_backend import ModelBackend, PromptChunk, SliceProgress, StepOutput
from tests.helpers import completions, run_until_idle
from tests.unit.fakes import EOS, FakeBackend, FakeModel, FakeTokenizer, next_token
from tests.unit.step_fakes import ClockedStepBackend, StepBackend


def make_engine(
    capacity: int = 200, backend: FakeBackend | None = None, **config: Any
) -> tuple[BlockPoolBatchEngine, FakeBackend]:
    backend = backend or FakeBackend()
    budget = config.pop("prefill_token_budget", 8)
    settings = {"prefill_chunk_tokens": 4, **config}
    settings["pacer"] = PacerConfig(fixed_tokens=budget)
    engine = BlockPoolBatchEngine(
        backend, FakeTokenizer(), BlockPool(capacity), EngineConfig(**settings)
    )
    return engine, backend


def cold_tokens(prompt: list[int], n: int) -> list[int]:
    history, out = list(prompt), []
    for _ in range(n):
        out.append(next_token(history))
        history.append(out[-1])
    return out


PROMPT = [5, 9, 2, 7, 11, 3, 8, 1, 4, 6]


def test_a_request_streams_its_tokens_then_completes_with_its_blocks() -> None:
    engine, _ = make_engine()
    rid = engine.submit("agent", PROMPT, max_tokens=6)
    events = run_until_idle(engine)
    tokens = [e.token_id for e in events if isinstance(e, TokenEvent)]
    done = completions(events)[rid]
    assert tokens == cold_tokens(PROMPT, 6) == list(done.token_ids)
    assert done.finish_reason is FinishReason.MAX_TOKENS
    assert done.blocks is not None
    assert done.blocks.n_tokens == len(PROMPT) + 6
    done.blocks.validate(engine._spec)  # noqa: SLF001 - the engine's own spec
    assert done.text == FakeTokenizer().decode(tokens)
    engine.release_blocks(rid)
    assert engine.pool.used_count == 0


def test_restored_blocks_continue_exactly_as_a_cold_prefill() -> None:
    engine, backend = make_engine()
    first = engine.submit("agent", PROMPT, max_tokens=5)
    earlier = completions(run_until_idle(engine))[first]
    assert earlier.blocks is not None
    follow_up = [*list(earlier.blocks.token_ids), 13, 14, 15]
    rid = engine.submit("agent", follow_up, earlier.blocks, max_tokens=7)
    engine.release_blocks(first)  # the submit pinned what it needs
    done = completions(run_until_idle(engine))[rid]
    assert list(done.token_ids) == cold_tokens(follow_up, 7)
    assert done.stats.cached_tokens == len(earlier.blocks.token_ids)
    assert dict(backend.made("restore"))[rid] == follow_up[: done.stats.cached_tokens]
    engine.release_blocks(rid)
    assert engine.pool.used_count == 0


def test_restored_blocks_stay_pinned_while_the_backend_reads_them_in_place() -> None:
    engine, backend = make_engine()
    first = engine.submit("agent", PROMPT, max_tokens=5)
    earlier = completions(run_until_idle(engine))[first]
    assert earlier.blocks is not None
    rid = engine.submit("agent", [*earlier.blocks.token_ids, 13], earlier.blocks, max_tokens=4)
    engine.release_blocks(first)
    backend.reading_restored.add(rid)
    engine.step()
    engine.step()
    assert f"{rid}/pin" in engine.pool.owners()  # admitted, but its blocks are still read
    backend.reading_restored.clear()
    engine.step()
    assert f"{rid}/pin" not in engine.pool.owners()
    run_until_idle(engine)
    engine.release_blocks(rid)
    assert engine.pool.used_count == 0


def test_a_cache_covering_the_whole_prompt_still_feeds_the_last_token() -> None:
    engine, backend = make_engine()
    first = engine.submit("agent", PROMPT, max_tokens=3)
    blocks = completions(run_until_idle(engine))[first].blocks
    assert blocks is not None
    rid = engine.submit("agent", PROMPT, blocks, max_tokens=3)
    done = completions(run_until_idle(engine))[rid]
    assert done.stats.cached_tokens == len(PROMPT) - 1
    assert done.stats.computed_tokens == 1
    assert list(done.token_ids) == cold_tokens(PROMPT, 3)
    assert backend.made("prefill")[-1] == (rid, 1)


def test_long_prompts_prefill_in_aligned_chunks_within_the_round_budget() -> None:
    engine, backend = make_engine(prefill_chunk_tokens=4, prefill_token_budget=6)
    rid = engine.submit("agent", list(range(1, 20)), max_tokens=2)
    engine.step()
    assert [n for seq, n in backend.made("prefill") if seq == rid] == [4, 2]
    engine.step()
    assert [n for seq, n in backend.made("prefill") if seq == rid] == [4, 2, 2, 4]
    run_until_idle(engine)
    assert sum(n for seq, n in backend.made("prefill") if seq == rid) == 19


def test_requests_decode_together_in_one_batch() -> None:
    engine, backend = make_engine(prefill_token_budget=256)
    ids = [engine.submit(f"a{i}", [i + 1, i + 2, i + 3], max_tokens=8) for i in range(8)]
    events = run_until_idle(engine)
    assert max(backend.made("step")) == 8
    done = completions(events)
    for i, rid in enumerate(ids):
        assert list(done[rid].token_ids) == cold_tokens([i + 1, i + 2, i + 3], 8)


@pytest.mark.parametrize("steps_before_cancel", [0, 1, 3])
def test_cancelling_at_any_stage_frees_every_block(steps_before_cancel: int) -> None:
    engine, _ = make_engine(prefill_token_budget=4)
    rid = engine.submit("agent", list(range(1, 30)), max_tokens=50)
    for _ in range(steps_before_cancel):
        engine.step()
    engine.cancel(rid)
    done = completions(run_until_idle(engine))[rid]
    assert done.finish_reason is FinishReason.CANCELLED
    engine.release_blocks(rid)
    assert engine.pool.used_count == 0
    engine.pool.check_integrity()


def test_a_dry_pool_mid_decode_ends_the_request_gracefully_with_its_kv() -> None:
    engine, _ = make_engine(capacity=6)  # 2 layers x 3 blocks of 4 tokens = 12 positions
    rid = engine.submit("agent", PROMPT, max_tokens=20)
    done = completions(run_until_idle(engine))[rid]
    assert done.finish_reason is FinishReason.POOL_EXHAUSTED
    assert done.blocks is not None
    assert done.blocks.n_tokens == 12
    assert list(done.token_ids) == cold_tokens(PROMPT, 2)
    engine.release_blocks(rid)
    assert engine.pool.used_count == 0


def test_an_end_of_turn_token_finishes_the_request_and_is_kept() -> None:
    engine, _ = make_engine(backend=FakeBackend(FakeModel(eos_at_length=len(PROMPT) + 3)))
    rid = engine.submit("agent", PROMPT, max_tokens=20)
    done = completions(run_until_idle(engine))[rid]
    assert done.finish_reason is FinishReason.END_OF_TURN
    assert done.token_ids[-1] == EOS


def test_fresh_prompts_arriving_together_share_one_prefill_pass() -> None:
    engine, backend = make_engine(prefill_token_budget=64, prefill_chunk_tokens=16)
    prompts = [PROMPT, PROMPT[:4], [3, 1, 4, 1, 5]]
    ids = [engine.submit(f"a{i}", p, max_tokens=4) for i, p in enumerate(prompts)]
    done = completions(run_until_idle(engine))
    assert backend.made("batch") == [3]
    assert [list(done[i].token_ids) for i in ids] == [cold_tokens(p, 4) for p in prompts]


@pytest.mark.parametrize("chunk", [4, 16], ids=["chunked", "batched-then-alone"])
def test_a_failed_prefill_fails_only_its_own_request(chunk: int) -> None:
    engine, _ = make_engine(
        backend=FakeBackend(fail_prefill_for={42}),
        prefill_token_budget=64,
        prefill_chunk_tokens=chunk,
    )
    good = engine.submit("good", [1, 2, 3, 4, 5, 6], max_tokens=3)
    bad = engine.submit("bad", [42, *list(range(1, 9))], max_tokens=3)
    done = completions(run_until_idle(engine))
    assert done[bad].finish_reason is FinishReason.ERROR
    assert done[bad].error
    assert done[good].finish_reason is FinishReason.MAX_TOKENS
    engine.release_blocks(good)
    assert engine.pool.used_count == 0


def test_two_hundred_mixed_requests_leak_nothing() -> None:
    rng = random.Random(7)
    engine, _ = make_engine(capacity=40, prefill_token_budget=16)
    outcomes: dict[FinishReason, int] = {}
    live_peak = 0
    submitted = 0
    while submitted < 200 or engine.has_work():
        if submitted < 200 and rng.random() < 0.5:
            prompt = [rng.randrange(1, 60) for _ in range(rng.randrange(1, 12))]
            greedy = rng.random() < 0.15  # more than the pool holds: ends pool_exhausted
            max_tokens = 150 if greedy else rng.randrange(1, 30)
            rid = engine.submit(f"a{submitted}", prompt, max_tokens=max_tokens)
            submitted += 1
            if rng.random() < 0.2:
                engine.cancel(rid)
        result = engine.step()
        finished = [e for e in result.events if isinstance(e, CompletionEvent)]
        held_by_finished = sum(e.blocks.block_count() for e in finished if e.blocks)
        needed = sum(r.reservation.block_count for r in engine._running.values())  # noqa: SLF001
        assert engine.pool.used_count == needed + held_by_finished, "a block leaked"
        live_peak = max(live_peak, needed + held_by_finished)
        for event in finished:
            outcomes[event.finish_reason] = outcomes.get(event.finish_reason, 0) + 1
            engine.release_blocks(event.request_id)
    assert sum(outcomes.values()) == 200
    assert outcomes.get(FinishReason.POOL_EXHAUSTED, 0) >= 20
    assert outcomes.get(FinishReason.CANCELLED, 0) > 0
    assert engine.pool.used_count == 0
    assert engine.pool.usage().peak_used == live_peak


def test_a_request_whose_cache_cannot_be_built_fails_alone() -> None:
    class BrokenOpen(FakeBackend):
        def open_sequence(self, seq_id: str, **kwargs: Any) -> bool:
            if kwargs["n_new"] == 7:
                raise RuntimeError("cannot build this cache")
            return super().open_sequence(seq_id, **kwargs)

    engine, _ = make_engine(backend=BrokenOpen())
    bad = engine.submit("bad", list(range(1, 8)), max_tokens=3)
    good = engine.submit("good", [1, 2, 3], max_tokens=3)
    done = completions(run_until_idle(engine))
    assert done[bad].finish_reason is FinishReason.ERROR
    assert done[good].finish_reason is FinishReason.MAX_TOKENS


def test_a_cache_that_fails_as_it_joins_the_decode_batch_fails_only_its_request() -> None:
    engine, backend = make_engine()
    good = engine.submit("good", PROMPT, max_tokens=6)
    engine.step()
    bad = engine.submit("bad", [1, 2, 3], max_tokens=6)
    backend.fail_join_for.add(bad)
    done = completions(run_until_idle(engine))
    assert done[bad].finish_reason is FinishReason.ERROR
    assert "no room" in (done[bad].error or "")
    assert list(done[good].token_ids) == cold_tokens(PROMPT, 6)
    engine.release_blocks(good)
    assert engine.pool.used_count == 0


def sliced_engine(
    capacity: int = 200, ride_rows: int = 0, ride_ratio: float = 3.0
) -> tuple[BlockPoolBatchEngine, StepBackend]:
    backend = StepBackend(FakeBackend(ride_rows=ride_rows))
    return sliced_on(backend, capacity, ride_ratio), backend


def sliced_on(
    backend: ModelBackend, capacity: int = 200, ride_ratio: float = 3.0
) -> BlockPoolBatchEngine:
    """An engine that slices a lone prompt beside streams; a ``StepBackend`` where the test
    needs the step beside a slice, which the MLX backend's own steps (``RoundRunner``) give."""
    pacer = PacerConfig(idle_tokens=4, slice_ratio=2.0, slice_tokens=4, ride_ratio=ride_ratio)
    config = EngineConfig(prefill_chunk_tokens=4, pacer=pacer)
    return BlockPoolBatchEngine(backend, FakeTokenizer(), BlockPool(capacity), config)


def test_a_sliced_chunk_spans_rounds_while_every_stream_gets_a_token_each_round() -> None:
    engine, backend = sliced_engine()
    stream = engine.submit("stream", [3, 1, 4], max_tokens=40)
    engine.step()
    long_prompt = [5, 9, 2, 7, 11, 3, 8, 1, 4, 6, 2, 9]
    late = engine.submit("late", long_prompt, max_tokens=3)
    tokens_per_round: list[int] = []
    events: list[Any] = []
    while engine.has_work():
        step = engine.step()
        events += step.events
        if any(c.request_id == late for c in completions(step.events).values()):
            break
        tokens_per_round.append(sum(1 for e in step.events if isinstance(e, TokenEvent)))
    chunks = [(n, done) for seq, n, done in backend.slices if seq == late]
    assert chunks == [(4, False), (4, False), (4, True)] * 3  # three chunks, three slices each
    # the stream's first step only feeds its first token (the fake pipelines like MLX's);
    # after that it gets a token in every round, the sliced chunk's rounds included
    assert all(count >= 1 for count in tokens_per_round[1:])
    done = completions(events + run_until_idle(engine))
    assert list(done[late].token_ids) == cold_tokens(long_prompt, 3)
    assert done[stream].finish_reason is FinishReason.MAX_TOKENS


def _paced_engine(backend: ClockedStepBackend) -> BlockPoolBatchEngine:
    """An engine on ``backend``'s clock, sliced at 2 steps a round, with one stream."""
    pacer = PacerConfig(idle_tokens=4, slice_ratio=2.0, slice_tokens=4, ride_ratio=None)
    config = EngineConfig(prefill_chunk_tokens=4, pacer=pacer)
    engine = BlockPoolBatchEngine(
        backend, FakeTokenizer(), BlockPool(200), config, clock=lambda: backend.now
    )
    engine.submit("stream", [3, 1, 4], max_tokens=200)
    return engine


def test_a_sliced_prompts_rounds_are_held_to_the_streams_pace_before_it_came() -> None:
    backend = ClockedStepBackend()
    engine = _paced_engine(backend)
    for _ in range(20):  # 10 ms steps, nothing beside them
        engine.step()
    backend.step_s = 0.014  # beside the prompt the streams' steps run slower
    late = engine.submit("late", PROMPT * 4, max_tokens=1)
    while late not in completions(engine.step().events):
        pass
    # every round is three of the steps before the prompt came (10 + 20 ms of slice), not
    # three of the slower ones it sees: 30 - 14 ms is left for each slice
    assert len(backend.budgets) == 30
    assert backend.budgets == pytest.approx([0.016] * 30)


@dataclass
class _SteppedSlices(ClockedStepBackend):
    """A chunk is ``chunk_steps`` steps of ``slice_step_s``, run while they fit the time
    given; ``rounds`` holds each round's slice time, a round starting at its decode step."""

    slice_step_s: float = 0.005
    chunk_steps: int = 6
    done_steps: dict[str, int] = field(default_factory=dict)
    rounds: list[float] = field(default_factory=list)

    def decode_step(self, ride: PromptChunk | None = None) -> StepOutput:
        self.rounds.append(0.0)
        return super().decode_step(ride)

    def prefill_slice(
        self,
        seq_id: str,
        tokens: Sequence[int],
        seconds: float,
        *,
        last: bool,
        must_progress: bool = True,
    ) -> SliceProgress:
        self.calls.append((len(tokens), seconds, must_progress))
        done, used = self.done_steps.pop(seq_id, 0), 0.0
        while done < self.chunk_steps and (
            used + self.slice_step_s <= seconds + 1e-9 or (must_progress and not used)
        ):
            done, used = done + 1, used + self.slice_step_s
        self.now += used
        self.rounds[-1] += used
        if done < self.chunk_steps:
            self.done_steps[seq_id] = done
            return SliceProgress(False)
        return StepBackend.prefill_slice(self, seq_id, tokens, math.inf, last=last)


def test_a_chunk_that_ends_early_hands_the_rest_of_its_round_to_the_next_chunk() -> None:
    backend = _SteppedSlices()
    engine = _paced_engine(backend)
    for _ in range(20):
        engine.step()
    late = engine.submit("late", PROMPT * 4, max_tokens=1)
    while (done := completions(engine.step().events).get(late)) is None:
        pass
    sliced = [seconds for seconds in backend.rounds if seconds]
    # ten chunks of six 5 ms steps in rounds of 20 ms of slice: four steps a round, so 15
    # rounds, where stopping at each chunk's end took 20; and no round over its 20 ms
    assert len(sliced) == 15
    assert max(sliced) == pytest.approx(0.020)
    assert list(done.token_ids) == cold_tokens(PROMPT * 4, 1)


def test_a_sliced_rounds_decode_step_runs_beside_its_slice_and_changes_no_token() -> None:
    def run(side_by_side: bool) -> tuple[dict[str, Any], StepBackend]:
        backend = StepBackend(side_by_side=side_by_side)
        engine = sliced_on(backend)
        stream = engine.submit("stream", [3, 1, 4], max_tokens=40)
        engine.step()
        late = engine.submit("late", [5, 9, 2, 7, 11, 3, 8, 1, 4, 6, 2, 9], max_tokens=3)
        done = completions(run_until_idle(engine))
        return {"stream": done[stream].token_ids, "late": done[late].token_ids}, backend

    beside, backend = run(side_by_side=True)
    apart, _ = run(side_by_side=False)
    assert beside == apart
    # the late prompt's rounds ran the stream's step beside their slices, and after the
    # stream's first step (which only feeds its first token) each made it a token
    assert len(backend.beside) >= 7
    assert [len(output.tokens) for output in backend.beside[1:]] == [1] * (len(backend.beside) - 1)


def test_a_step_that_fails_beside_a_slice_fails_the_streams_not_the_prompt() -> None:
    backend = StepBackend()
    engine = sliced_on(backend)
    stream = engine.submit("stream", [3, 1, 4], max_tokens=40)
    engine.step()
    engine.step()
    backend.side_by_side = backend.fail_beside = True
    late = engine.submit("late", [5, 9, 2, 7, 11, 3, 8, 1], max_tokens=3)
    done = completions(run_until_idle(engine))
    assert done[stream].finish_reason is FinishReason.ERROR
    assert "failed on purpose" in (done[stream].error or "")
    assert list(done[late].token_ids) == cold_tokens([5, 9, 2, 7, 11, 3, 8, 1], 3)


def test_a_step_beside_a_slice_leaves_the_slice_the_whole_round_and_the_pace_alone() -> None:
    backend = _SteppedSlices(side_by_side=True)
    engine = _paced_engine(backend)
    for _ in range(20):  # 10 ms steps
        engine.step()
    backend.step_s = 0.0  # begun beside the slice, the step takes none of this thread's time
    late = engine.submit("late", PROMPT * 4, max_tokens=1)
    while late not in completions(engine.step().events):
        pass
    sliced = [seconds for seconds in backend.rounds if seconds]
    # rounds of three 10 ms steps, all of them slice: 300 ms of steps in ten rounds, where
    # a step before each slice left it 20 ms, and 15 rounds
    assert sliced == pytest.approx([0.030] * 10)
    assert len(backend.beside) == 10
    # nor does a step begun beside a slice (begin to end: the whole round) teach the pacer
    assert engine.pacer.decode_seconds == pytest.approx(0.010)
    assert engine.pacer.anchor(1) == pytest.approx(0.010)


def test_cancelling_a_prompt_in_the_middle_of_a_slice_frees_its_blocks() -> None:
    engine, backend = sliced_engine()
    stream = engine.submit("stream", [3, 1, 4], max_tokens=40)
    engine.step()
    late = engine.submit("late", list(range(1, 13)), max_tokens=3)
    engine.step()
    assert backend.slices[-1] == (late, 4, False)
    engine.cancel(late)
    done = completions(engine.step().events)
    assert done[late].finish_reason is FinishReason.CANCELLED
    held = sum(r.reservation.block_count for r in engine._running.values())  # noqa: SLF001
    assert engine.pool.used_count == held  # the stream's blocks only
    assert late not in engine._running  # noqa: SLF001
    engine.cancel(stream)
    run_until_idle(engine)
    engine.release_blocks(stream)
    assert engine.pool.used_count == 0


def test_a_second_arrival_leaves_the_chunk_in_flight_as_it_began() -> None:
    engine, backend = sliced_engine()
    engine.submit("stream", [3, 1, 4], max_tokens=40)
    engine.step()
    late = engine.submit("late", [5, 9, 2, 7, 11, 3, 8, 1], max_tokens=3)
    engine.step()
    other = engine.submit("other", [2, 7, 1, 8], max_tokens=3)
    done = completions(run_until_idle(engine))
    assert {n for seq, n, _ in backend.slices if seq == late} == {4}
    assert [ok for seq, _, ok in backend.slices if seq == late][:3] == [False, False, True]
    assert list(done[late].token_ids) == cold_tokens([5, 9, 2, 7, 11, 3, 8, 1], 3)
    assert list(done[other].token_ids) == cold_tokens([2, 7, 1, 8], 3)


@pytest.mark.parametrize(("ride_ratio", "rides"), [(3.0, True), (0.01, False)])
def test_a_chunk_cheap_enough_to_ride_rides_instead_of_being_sliced(
    ride_ratio: float, rides: bool
) -> None:
    """The pacer's prior puts a 4-token ride at ~13 ms and a decode step at 100 ms."""
    engine, backend = sliced_engine(ride_rows=32, ride_ratio=ride_ratio)
    engine.submit("stream", [3, 1, 4], max_tokens=40)
    engine.step()
    late = engine.submit("late", [5, 9, 2, 7, 11, 3, 8, 1], max_tokens=3)
    done = completions(run_until_idle(engine))
    assert (backend.fake.made("ride") == [(late, 4), (late, 4)]) is rides
    assert (backend.slices == []) is rides
    assert list(done[late].token_ids) == cold_tokens([5, 9, 2, 7, 11, 3, 8, 1], 3)


def test_a_prefix_too_big_to_sit_beside_its_copy_is_still_used_not_waited_on() -> None:
    """The prefix stays pinned until admission copies it, so admitting needs room for both;
    with nothing running, nothing would ever make that room. Its pin goes, its memory stays
    with the request until copied (an agent past ~40% of the pool must not compute its
    whole history every turn)."""
    engine, _ = make_engine(capacity=16)
    first = engine.submit("agent", PROMPT, max_tokens=5)
    earlier = completions(run_until_idle(engine))[first].blocks
    assert earlier is not None
    follow_up = [*earlier.token_ids, 13, 14, 15]
    rid = engine.submit("agent", follow_up, earlier, max_tokens=7)
    engine.release_blocks(first)
    done = completions(run_until_idle(engine))[rid]
    assert list(done.token_ids) == cold_tokens(follow_up, 7)
    assert done.stats.cached_tokens == len(earlier.token_ids)
    engine.release_blocks(rid)
    assert engine.pool.used_count == 0


def test_prefixes_pinned_by_requests_queued_behind_give_way_to_the_head() -> None:
    engine, _ = make_engine(capacity=16)
    first = engine.submit("agent", PROMPT, max_tokens=5)
    earlier = completions(run_until_idle(engine))[first].blocks
    assert earlier is not None
    fresh = [(7 * i) % 50 + 1 for i in range(18)]
    head = engine.submit("other", fresh, max_tokens=2)
    behind = engine.submit("agent", [*earlier.token_ids, 13], earlier, max_tokens=2)
    engine.release_blocks(first)
    done: dict[str, CompletionEvent] = {}
    while engine.has_work():
        done |= completions(engine.step().events)
        if head in done:
            engine.release_blocks(head)  # as the cache does once it adopts them
    assert list(done[head].token_ids) == cold_tokens(fresh, 2)
    assert list(done[behind].token_ids) == cold_tokens([*earlier.token_ids, 13], 2)
    engine.release_blocks(behind)
    assert engine.pool.used_count == 0


def reloadable(engine: BlockPoolBatchEngine, blocks: AgentBlocks) -> tuple[StoredPrefix, list[str]]:
    """A stored prefix that, like one read from disk, comes back on fresh pool blocks."""
    owners: list[str] = []

    def pin(owner: str) -> AgentBlocks:
        owners.append(owner)
        layers = tuple(
            tuple(replace(b, pool_id=engine.pool.allocate(owner, b.layer)[0]) for b in layer)
            for layer in blocks.layers
        )
        return replace(blocks, layers=layers)

    return StoredPrefix(len(blocks.token_ids), pin, blocks.block_count), owners


def finished_blocks(engine: BlockPoolBatchEngine, prompt: list[int] = PROMPT) -> AgentBlocks:
    """An earlier turn's blocks, gone from the pool as if evicted to disk."""
    first = engine.submit("agent", prompt, max_tokens=5)
    earlier = completions(run_until_idle(engine))[first].blocks
    assert earlier is not None
    engine.release_blocks(first)
    return earlier


def run_releasing(engine: BlockPoolBatchEngine) -> dict[str, CompletionEvent]:
    done: dict[str, CompletionEvent] = {}
    while engine.has_work():
        finished = completions(engine.step().events)
        for rid in finished:
            engine.release_blocks(rid)  # as the cache does once it adopts them
        done |= finished
    return done


def test_a_prefix_let_go_for_the_head_is_pinned_again_at_its_own_turn() -> None:
    """Its pin and the head's prompt do not fit together; it alone does."""
    engine, _ = make_engine(capacity=18)
    earlier = finished_blocks(engine)
    stored, owners = reloadable(engine, earlier)
    fresh = [(7 * i) % 50 + 1 for i in range(26)]
    head = engine.submit("other", fresh, max_tokens=2)
    follow_up = [*earlier.token_ids, 13]
    behind = engine.submit("agent", follow_up, stored.pin("restore"), max_tokens=2, stored=stored)
    engine.pool.release_owner("restore")
    done = run_releasing(engine)
    assert list(done[head].token_ids) == cold_tokens(fresh, 2)
    assert list(done[behind].token_ids) == cold_tokens(follow_up, 2)
    assert done[behind].stats.cached_tokens == len(earlier.token_ids)
    assert len(owners) == 2  # read at arrival, then again at its admission
    assert engine.pool.used_count == 0


def test_a_head_that_pinned_nothing_at_arrival_gets_its_prefix_once_pins_behind_go() -> None:
    """Arriving, it found the pool full (its restore pinned nothing); the pin of the request
    behind it is let go for it, and its own prefix is pinned in that room before its prompt."""
    engine, _ = make_engine(capacity=18)
    earlier = finished_blocks(engine)
    stored, _ = reloadable(engine, earlier)
    other_prompt = [(3 * i) % 40 + 1 for i in range(16)]
    other = finished_blocks(engine, other_prompt)
    other_stored, _ = reloadable(engine, other)
    follow_up = [*earlier.token_ids, 13]
    head = engine.submit("agent", follow_up, max_tokens=2, stored=stored)
    behind_prompt = [*other.token_ids, 14]
    behind = engine.submit(
        "other", behind_prompt, other_stored.pin("restore"), max_tokens=2, stored=other_stored
    )
    engine.pool.release_owner("restore")
    done = run_releasing(engine)
    assert done[head].stats.cached_tokens == len(earlier.token_ids)
    assert list(done[head].token_ids) == cold_tokens(follow_up, 2)
    assert list(done[behind].token_ids) == cold_tokens(behind_prompt, 2)
    assert engine.pool.used_count == 0


def test_a_prefix_cut_short_at_arrival_is_completed_at_admission() -> None:
    engine, _ = make_engine(capacity=40)
    earlier = finished_blocks(engine)
    stored, owners = reloadable(engine, earlier)
    whole = stored.pin("restore")
    assert whole is not None
    first = tuple(layer[:1] for layer in whole.layers)
    first_block = AgentBlocks("agent", whole.token_ids[:4], first)
    follow_up = [*earlier.token_ids, 13]
    rid = engine.submit("agent", follow_up, first_block, max_tokens=3, stored=stored)
    engine.pool.release_owner("restore")
    done = run_releasing(engine)[rid]
    assert done.stats.cached_tokens == len(earlier.token_ids)
    assert list(done.token_ids) == cold_tokens(follow_up, 3)
    assert len(owners) == 2
    assert engine.pool.used_count == 0


def test_a_stored_prefix_that_cannot_be_read_again_keeps_what_was_pinned() -> None:
    engine, _ = make_engine(capacity=40)
    earlier = finished_blocks(engine)
    stored, _ = reloadable(engine, earlier)
    whole = stored.pin("restore")

    def unreadable(owner: str) -> AgentBlocks:
        engine.pool.allocate(owner, 0)  # it had pinned something before failing
        raise OSError("the disk went away")

    follow_up = [*earlier.token_ids, 13]
    longer = StoredPrefix(len(earlier.token_ids) + 1, unreadable)
    rid = engine.submit("agent", follow_up, whole, max_tokens=3, stored=longer)
    engine.pool.release_owner("restore")
    done = run_releasing(engine)[rid]
    assert done.finish_reason is FinishReason.MAX_TOKENS
    assert done.stats.cached_tokens == len(earlier.token_ids)
    assert list(done.token_ids) == cold_tokens(follow_up, 3)
    assert engine.pool.used_count == 0


@pytest.mark.parametrize("saved_in_time", [True, False])
def test_a_head_that_fits_beside_its_prefix_waits_for_blocks_being_saved(
    saved_in_time: bool,
) -> None:
    """Blocks a finished request leaves are held until they are on disk; the head keeps its
    pin that long, up to its patience; then the pin goes, and the prefix is used anyway."""
    now = [0.0]
    backend = FakeBackend()
    engine = BlockPoolBatchEngine(
        backend,
        FakeTokenizer(),
        BlockPool(22),
        EngineConfig(prefill_chunk_tokens=4, pacer=PacerConfig(fixed_tokens=8)),
        clock=lambda: now[0],
    )
    earlier = finished_blocks(engine)
    stored, _ = reloadable(engine, earlier)
    saving = engine.submit("other", [(3 * i) % 40 + 1 for i in range(12)], max_tokens=2)
    run_until_idle(engine)  # its blocks stay held, as while the cache saves them
    follow_up = [*earlier.token_ids, 13]
    rid = engine.submit("agent", follow_up, stored.pin("restore"), max_tokens=2, stored=stored)
    engine.pool.release_owner("restore")
    for _ in range(3):
        engine.step()
    assert engine.waiting == 1
    assert f"{rid}/pin" in engine.pool.owners()
    if saved_in_time:
        engine.release_blocks(saving)
    else:
        now[0] += HEAD_PIN_PATIENCE_S
        engine.step()
        assert engine.waiting == 0, "past its patience it is admitted, without its pin"
        assert f"{rid}/pin" not in engine.pool.owners()
    done = run_releasing(engine)[rid]
    assert done.stats.cached_tokens == len(earlier.token_ids)
    assert list(done.token_ids) == cold_tokens(follow_up, 2)
    engine.release_blocks(saving)
    assert engine.pool.used_count == 0


def test_a_request_waits_while_finished_blocks_fill_the_pool_then_runs() -> None:
    engine, _ = make_engine(capacity=16)
    first = engine.submit("agent", PROMPT, max_tokens=5)  # its blocks stay held: not released
    run_until_idle(engine)
    fresh = [(7 * i) % 50 + 1 for i in range(18)]
    rid = engine.submit("other", fresh, max_tokens=2)
    for _ in range(5):
        engine.step()
    assert engine.waiting == 1
    engine.release_blocks(first)  # as the cache does once they are on disk
    done = completions(run_until_idle(engine))[rid]
    assert list(done.token_ids) == cold_tokens(fresh, 2)
    engine.release_blocks(rid)
    assert engine.pool.used_count == 0


def test_a_head_with_nothing_running_is_refused_when_no_memory_comes_free() -> None:
    """Memory held by what never lets go (a save hung on a dead disk): after its patience
    the head is refused (an HTTP 429 to retry), and the next in line is not stuck behind."""
    now = [0.0]
    engine = BlockPoolBatchEngine(
        FakeBackend(),
        FakeTokenizer(),
        BlockPool(16),
        EngineConfig(prefill_chunk_tokens=4, pacer=PacerConfig(fixed_tokens=8)),
        clock=lambda: now[0],
    )
    held = engine.submit("agent", PROMPT, max_tokens=5)
    run_until_idle(engine)  # its blocks stay held: never released, as if never saved
    fresh = [(7 * i) % 50 + 1 for i in range(18)]
    rid = engine.submit("other", fresh, max_tokens=2)
    for _ in range(3):
        engine.step()
    assert engine.waiting == 1
    now[0] += NO_ROOM_PATIENCE_S
    done = completions(run_until_idle(engine))[rid]
    assert (done.finish_reason, done.error) == (FinishReason.ERROR, NO_ROOM_FAILURE)
    assert engine.waiting == 0
    engine.release_blocks(held)
    assert engine.pool.used_count == 0


SHARED = list(range(1, 13))  # three blocks of four tokens


def test_prompts_admitted_together_compute_their_shared_prefix_once() -> None:
    engine, backend = make_engine(prefill_token_budget=64)
    prompts = [[*SHARED, 20 + i, 30 + i] for i in range(4)]
    ids = [engine.submit(f"a{i}", p, max_tokens=3) for i, p in enumerate(prompts)]
    done = completions(run_until_idle(engine))
    assert [list(done[i].token_ids) for i in ids] == [cold_tokens(p, 3) for p in prompts]
    computed = {rid: sum(n for seq, n in backend.made("prefill") if seq == rid) for rid in ids}
    assert computed == {ids[0]: 14, ids[1]: 2, ids[2]: 2, ids[3]: 2}
    assert [(source, n) for source, _, n in backend.made("copy")] == [(ids[0], 12)] * 3
    assert [done[i].stats.cached_tokens for i in ids] == [0, 12, 12, 12]
    for rid in ids:
        engine.release_blocks(rid)
    assert engine.pool.used_count == 0


def test_followers_of_a_leader_that_fails_first_are_let_go_and_nothing_leaks() -> None:
    """The leader fails inside the shared prefix: its followers stop waiting and prefill it
    themselves (here they meet the same failure, as a model would)."""
    engine, backend = make_engine(
        backend=FakeBackend(fail_prefill_for={5}), prefill_token_budget=64
    )
    ids = [engine.submit(f"a{i}", [*SHARED, 20 + i, 30 + i], max_tokens=3) for i in range(3)]
    done = completions(run_until_idle(engine))
    assert [done[i].finish_reason for i in ids] == [FinishReason.ERROR] * 3
    assert not backend.made("copy")
    assert engine.pool.used_count == 0
    engine.pool.check_integrity()


def test_a_leader_that_fails_after_the_shared_prefix_fails_alone() -> None:
    engine, backend = make_engine(
        backend=FakeBackend(fail_prefill_for={59}), prefill_token_budget=64
    )
    leader = engine.submit("leader", [*SHARED, 59, 21], max_tokens=3)
    follower = engine.submit("follower", [*SHARED, 30, 31], max_tokens=3)
    done = completions(run_until_idle(engine))
    assert done[leader].finish_reason is FinishReason.ERROR
    assert list(done[follower].token_ids) == cold_tokens([*SHARED, 30, 31], 3)
    assert [(s, t, n) for s, t, n in backend.made("copy")] == [(leader, follower, 12)]
    engine.release_blocks(follower)
    assert engine.pool.used_count == 0


def test_a_request_arriving_while_its_leader_decodes_copies_the_prefix_at_once() -> None:
    engine, backend = make_engine(prefill_token_budget=64)
    leader = engine.submit("leader", [*SHARED, 20, 21], max_tokens=8)
    engine.step()
    engine.step()
    assert len(backend.model.decoding()) == 1
    follower = engine.submit("follower", [*SHARED, 30, 31], max_tokens=3)
    done = completions(run_until_idle(engine))
    assert list(done[follower].token_ids) == cold_tokens([*SHARED, 30, 31], 3)
    assert list(done[leader].token_ids) == cold_tokens([*SHARED, 20, 21], 8)
    assert backend.made("copy") == [(leader, follower, 12)]
    assert sum(n for seq, n in backend.made("prefill") if seq == follower) == 2


def test_requests_of_other_namespaces_never_copy_each_others_prefix() -> None:
    engine, backend = make_engine(prefill_token_budget=64)
    prompts = [[*SHARED, 20, 21], [*SHARED, 30, 31]]
    ids = [
        engine.submit("agent", prompt, max_tokens=3, namespace=tenant)
        for prompt, tenant in zip(prompts, ("tenant-a", "tenant-b"), strict=True)
    ]
    done = completions(run_until_idle(engine))
    assert not backend.made("copy")
    assert [done[i].stats.cached_tokens for i in ids] == [0, 0]


def test_a_request_queued_behind_another_tenant_restores_the_prefix_its_leader_left() -> None:
    """Issue 32: r1 in A, then a long request of namespace V (with the same system prompt),
    then r2 in A. r2 waits behind V's prefill until r1 has ended, so no leader runs when it
    is admitted; it restores the KV r1 left instead of computing the shared prefix, and V,
    another tenant, gets none of it."""
    engine, backend = make_engine(prefill_token_budget=8)
    first = engine.submit("a1", [*SHARED, 20, 21], max_tokens=2, namespace="A")
    engine.step()
    other = engine.submit("v", [*SHARED, *range(33, 61)], max_tokens=2, namespace="V")
    engine.step()
    second = engine.submit("a2", [*SHARED, 30, 31], max_tokens=3, namespace="A")
    assert engine.waiting == 1  # r2 only: V was admitted beside r1
    events: list[EngineEvent] = []
    while engine.waiting:
        events += engine.step().events
    done = completions(events + run_until_idle(engine))
    assert list(completions(events)) == [first]  # r1 ended before r2 was admitted
    assert list(done[second].token_ids) == cold_tokens([*SHARED, 30, 31], 3)
    assert dict(backend.made("restore"))[second] == SHARED
    assert sum(n for seq, n in backend.made("prefill") if seq == second) == 2
    assert [done[i].stats.cached_tokens for i in (first, other, second)] == [0, 0, 12]
    for rid in (first, other, second):
        engine.release_blocks(rid)
    assert engine.pool.used_count == 0
    engine.pool.check_integrity()


def _stored_turn(engine: BlockPoolBatchEngine) -> AgentBlocks:
    first = engine.submit("agent", PROMPT, max_tokens=6)
    earlier = completions(run_until_idle(engine))[first]
    assert earlier.blocks is not None
    return earlier.blocks


def test_a_restore_the_backend_cannot_build_is_dropped_and_the_prompt_computed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 36: a stored prefix the model could not use failed its request (a 500) and
    every later request that found it."""
    engine, backend = make_engine()
    stored = _stored_turn(engine)
    unusable = replace(
        stored,
        layers=tuple(tuple(replace(b, payload="junk") for b in layer) for layer in stored.layers),
    )
    follow_up = [*stored.token_ids, 13, 14, 15]
    for _ in range(2):  # the second finds the same blocks, and is not poisoned by them
        rid = engine.submit("agent", follow_up, unusable, max_tokens=5)
        done = completions(run_until_idle(engine))[rid]
        assert done.error is None
        assert list(done.token_ids) == cold_tokens(follow_up, 5)
        assert (done.stats.cached_tokens, done.stats.dropped_tokens) == (0, len(stored.token_ids))
        assert dict(backend.made("restore"))[rid] == []
        engine.release_blocks(rid)
    assert any(rid in r.getMessage() and r.exc_info for r in caplog.records)


def test_a_prefix_is_restored_only_as_far_as_every_layer_holds_it() -> None:
    engine, backend = make_engine()
    stored = _stored_turn(engine)  # 16 tokens: blocks 0..3 of 4 tokens
    holed = list(stored.layers)
    holed[1] = tuple(b for b in stored.layers[1] if b.index != 2)  # positions 8..11 gone
    follow_up = [*stored.token_ids, 13, 14, 15]
    rid = engine.submit("agent", follow_up, replace(stored, layers=tuple(holed)), max_tokens=5)
    done = completions(run_until_idle(engine))[rid]
    assert list(done.token_ids) == cold_tokens(follow_up, 5)
    assert done.stats.cached_tokens == 8
    assert done.stats.dropped_tokens == len(stored.token_ids) - 8
    assert dict(backend.made("restore"))[rid] == list(stored.token_ids[:8])


def test_a_request_that_fails_in_the_engine_logs_its_traceback_under_its_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine, _ = make_engine(backend=FakeBackend(fail_prefill_for={42}))
    rid = engine.submit("agent", [42, 1, 2], max_tokens=3)
    with caplog.at_level("ERROR"):
        done = completions(run_until_idle(engine))[rid]
    assert done.finish_reason is FinishReason.ERROR
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert rid in record.getMessage()
    assert record.exc_info is not None
    assert "prefill failed on purpose" in caplog.text
