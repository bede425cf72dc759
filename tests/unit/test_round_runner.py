"""RoundRunner: the order of a round on a backend's own steps, and its failures."""

from __future__ import annotations

from semantic.domain.generation import GREEDY
from semantic.ports.model_backend import (
    Failed,
    Join,
    Prefilled,
    PromptChunk,
    RoundWork,
    SlicedPrompt,
    SoFar,
    StepFailed,
    Stepped,
)
from tests.unit.fakes import FakeBackend


def _opened(backend: FakeBackend, *ids: str) -> None:
    for seq_id in ids:
        backend.open_sequence(seq_id, restored=None, n_restored=0, n_new=4, sampling=GREEDY)


def test_a_join_that_fails_fails_its_sequence_alone_and_the_step_runs() -> None:
    backend = FakeBackend()
    _opened(backend, "a", "b")
    work = RoundWork(decode=True, joins=(Join("gone", 5, 3), Join("a", 5, 3)))
    outcomes = backend.run(work).outcomes
    assert [type(o) for o in outcomes] == [Failed, Stepped]
    assert isinstance(outcomes[0], Failed)
    assert outcomes[0].seq_id == "gone"
    assert backend.decode_batches == [1]  # "a" joined and stepped
    chunk = PromptChunk("b", (1, 2, 3, 4), last=True)
    done = backend.run(RoundWork(decode=True, parts=(chunk,))).outcomes[-1]
    assert isinstance(done, Prefilled)
    assert done.chunks == (("b", 4),)
    assert done.firsts[0]


class _BrokenBeside(FakeBackend):
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
    assert backend.decode_batches == []
    assert seen == [SoFar(elapsed=None, step_seconds=None, decoding=1)]  # no step: no round yet
