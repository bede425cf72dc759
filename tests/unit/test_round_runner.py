"""RoundRunner: the order of a round on a backend's own steps, and its failures."""

from __future__ import annotations

from collections.abc import Sequence

from semantic.domain.generation import GREEDY
from semantic.ports.model_backend import (
    Failed,
    InFlight,
    Join,
    Prefilled,
    PromptChunk,
    RoundWork,
    SlicedPrompt,
    SoFar,
    StepFailed,
    Stepped,
    WholePrompts,
)
from tests.unit.fakes import FakeBackend
from tests.unit.step_fakes import ClockedStepBackend, StepBackend


def _opened(backend: StepBackend, *ids: str) -> None:
    for seq_id in ids:
        backend.open_sequence(seq_id, restored=None, n_restored=0, n_new=4, sampling=GREEDY)


def _sliced(seq_id: str, tokens: Sequence[int], sizes: tuple[int, ...]) -> SlicedPrompt:
    return SlicedPrompt(seq_id, tuple(tokens), sizes, 0, lambda _: 1.0)


def test_a_join_that_fails_fails_its_sequence_alone_and_the_step_runs() -> None:
    backend = StepBackend()
    _opened(backend, "a", "b")
    work = RoundWork(decode=True, joins=(Join("gone", 5, 3), Join("a", 5, 3)))
    outcomes = backend.run(work).outcomes
    assert [type(o) for o in outcomes] == [Failed, Stepped]
    assert isinstance(outcomes[0], Failed)
    assert outcomes[0].seq_id == "gone"
    assert backend.fake.made("step") == [1]  # "a" joined and stepped
    chunk = PromptChunk("b", (1, 2, 3, 4), last=True)
    done = backend.run(RoundWork(decode=True, parts=(chunk,))).outcomes[-1]
    assert isinstance(done, Prefilled)
    assert done.chunks == (("b", 4),)
    assert done.firsts[0]


def test_a_round_runs_joins_then_the_step_then_its_parts_in_order() -> None:
    backend = StepBackend(slice_calls=1)
    _opened(backend, "stream", "w1", "w2", "plain", "long")
    work = RoundWork(
        decode=True,
        joins=(Join("stream", 5, 3),),
        parts=(
            WholePrompts((("w1", (1, 2)), ("w2", (3, 4, 5)))),
            PromptChunk("plain", (6, 7), last=False),
            _sliced("long", (8, 9, 10), (3,)),
        ),
    )
    outcomes = backend.run(work).outcomes
    assert [type(o) for o in outcomes] == [Stepped, Prefilled, Prefilled, Prefilled]
    assert [o.chunks for o in outcomes if isinstance(o, Prefilled)] == [
        (("w1", 2), ("w2", 3)),
        (("plain", 2),),
        (("long", 3),),
    ]
    assert backend.fake.made("batch") == [2]
    assert backend.fake.made("step") == [1]


def test_a_step_beside_a_slice_is_begun_first_and_reported_after_it() -> None:
    backend = StepBackend(side_by_side=True)
    _opened(backend, "stream", "long")
    parts = (_sliced("long", (1, 2, 3, 4), (4,)),)
    work = RoundWork(decode=True, joins=(Join("stream", 5, 3),), parts=parts, sliced=True)
    outcomes = backend.run(work).outcomes
    assert [type(o) for o in outcomes] == [InFlight, Stepped]
    assert outcomes[0] == InFlight("long", 4)
    assert isinstance(outcomes[1], Stepped)
    assert (outcomes[1].beside, outcomes[1].seconds) == (True, None)
    assert backend.beside == [outcomes[1].output]


def test_a_failed_pass_of_whole_prompts_is_run_again_one_by_one() -> None:
    backend = StepBackend(FakeBackend(fail_prefill_for={42}))
    _opened(backend, "good", "bad", "also")
    prompts = (("good", (1, 2, 3)), ("bad", (42, 1)), ("also", (4, 5)))
    outcomes = backend.run(RoundWork(decode=False, parts=(WholePrompts(prompts),))).outcomes
    assert [type(o) for o in outcomes] == [Prefilled, Failed, Prefilled]
    assert [o.seq_id for o in outcomes if isinstance(o, Failed)] == ["bad"]
    assert [o.chunks for o in outcomes if isinstance(o, Prefilled)] == [
        (("good", 3),),
        (("also", 2),),
    ]
    assert all(o.firsts[0] for o in outcomes if isinstance(o, Prefilled))
    assert backend.fake.made("batch") == []
    assert backend.fake.made("prefill") == [("good", 3), ("also", 2)]


def test_a_failed_step_fails_its_sequences_and_the_other_prompts_go_on() -> None:
    backend = StepBackend(FakeBackend(fail_prefill_for={42}, ride_rows=32))
    _opened(backend, "stream", "rider", "other")
    work = RoundWork(
        decode=True,
        joins=(Join("stream", 5, 3),),
        ride=PromptChunk("rider", (42, 1), last=False),
        parts=(PromptChunk("rider", (2, 3), last=True), PromptChunk("other", (4, 5), last=True)),
    )
    outcomes = backend.run(work).outcomes
    assert [type(o) for o in outcomes] == [StepFailed, Prefilled]  # the rider's chunk skipped
    assert isinstance(outcomes[1], Prefilled)
    assert outcomes[1].chunks == (("other", 2),)


def test_a_step_that_fails_beside_its_slice_leaves_the_slice_alone() -> None:
    backend = StepBackend(slice_calls=1, side_by_side=True, fail_beside=True)
    _opened(backend, "stream", "long")
    parts = (_sliced("long", (1, 2, 3, 4), (4,)),)
    work = RoundWork(decode=True, joins=(Join("stream", 5, 3),), parts=parts, sliced=True)
    outcomes = backend.run(work).outcomes
    assert [type(o) for o in outcomes] == [Prefilled, StepFailed]
    assert isinstance(outcomes[1], StepFailed)
    assert outcomes[1].beside
    assert "on purpose" in str(outcomes[1].error)


def test_a_sequence_that_fails_to_join_in_the_step_runs_none_of_its_parts() -> None:
    backend = StepBackend(FakeBackend(fail_join_for={"bad"}))
    _opened(backend, "good", "bad")
    work = RoundWork(
        decode=True,
        joins=(Join("good", 5, 3), Join("bad", 6, 3)),
        parts=(PromptChunk("bad", (1, 2), last=False), PromptChunk("good", (3,), last=False)),
    )
    outcomes = backend.run(work).outcomes
    assert [type(o) for o in outcomes] == [Stepped, Prefilled]
    assert isinstance(outcomes[0], Stepped)
    assert list(outcomes[0].output.failed) == ["bad"]
    assert backend.fake.made("prefill") == [("good", 1)]


def test_a_slice_is_given_the_round_so_far() -> None:
    backend = ClockedStepBackend()
    _opened(backend, "stream", "long")
    seen: list[SoFar] = []

    def budget(so_far: SoFar) -> float:
        seen.append(so_far)
        return 0.5

    sliced = SlicedPrompt("long", (1, 2, 3, 4), (4,), 0, budget)
    work = RoundWork(decode=True, joins=(Join("stream", 5, 3),), parts=(sliced,), elapsed=0.005)
    backend.run(work)
    assert seen == [SoFar(elapsed=0.015, step_seconds=0.010, decoding=1)]
    assert backend.calls == [(4, 0.5, True)]


def test_a_chunk_that_ends_in_time_goes_on_into_the_next_while_time_is_left() -> None:
    backend = ClockedStepBackend(slice_calls=1, slice_s=0.6)
    _opened(backend, "long")
    sliced = _sliced("long", list(range(1, 13)), (4, 4, 4))
    outcomes = backend.run(RoundWork(decode=False, parts=(sliced,))).outcomes
    # 1.0 s: the first chunk takes 0.6, the second is given the 0.4 left and takes 0.6,
    # the third waits for the next round
    assert [(n, round(s, 6), first) for n, s, first in backend.calls] == [
        (4, 1.0, True),
        (4, 0.4, False),
    ]
    assert [(o.chunks, o.position, o.seconds) for o in outcomes if isinstance(o, Prefilled)] == [
        ((("long", 4),), 0, None),
        ((("long", 4),), 4, None),
    ]
    assert len(outcomes) == 2


def test_a_chunk_stopped_part_way_is_in_flight_and_the_next_waits() -> None:
    backend = ClockedStepBackend()
    _opened(backend, "long")
    sliced = _sliced("long", list(range(1, 9)), (4, 4))
    outcomes = backend.run(RoundWork(decode=False, parts=(sliced,))).outcomes
    assert outcomes == (InFlight("long", 4),)
    assert [n for n, _, _ in backend.calls] == [4]


class _BrokenBeside(StepBackend):
    def begin_decode_step(self) -> bool:
        raise RuntimeError("cannot begin on purpose")


def test_a_step_that_cannot_begin_beside_its_slice_fails_and_no_step_runs() -> None:
    backend = _BrokenBeside(side_by_side=True)
    _opened(backend, "a", "long")
    seen: list[SoFar] = []

    def budget(so_far: SoFar) -> float:
        seen.append(so_far)
        return 1.0

    sliced = SlicedPrompt("long", (1, 2, 3, 4), (4,), 0, budget)
    work = RoundWork(decode=True, joins=(Join("a", 5, 3),), parts=(sliced,), sliced=True)
    outcomes = backend.run(work).outcomes
    assert isinstance(outcomes[0], StepFailed)
    assert not outcomes[0].beside
    assert not any(isinstance(o, Stepped) for o in outcomes)
    assert backend.fake.made("step") == []
    assert seen == [SoFar(elapsed=None, step_seconds=None, decoding=1)]  # no step: no round yet
