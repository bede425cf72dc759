"""A decoding row's forced runs: what a step tells its grammar, and what it reports."""

from __future__ import annotations

from semantic.adapters.mlx.decode_rows import Row
from tests.unit.fakes import EOS, LiteralMatcher

STOP = frozenset({EOS})


def row_after(told: list[int], literal: tuple[int, ...], remaining: int) -> Row:
    """A row past its first step whose grammar is ``literal``, ``told`` its first tokens."""
    matcher = LiteralMatcher(literal)
    for token in told:
        matcher.accept(token)
    return Row("s", lambda logits: logits, False, remaining, has_output=True, matcher=matcher)


def test_a_run_follows_the_input_in_one_step_and_comes_with_it() -> None:
    row = row_after([], (7, 8, 9, 10), remaining=10)
    assert row.take_run(7, STOP, limit=32) == (8, 9, 10, EOS)
    reported = row.reported(7, 0.25, STOP)
    assert [t.token for t in reported] == [7, 8, 9, 10, EOS]
    assert [t.together for t in reported] == [False, True, True, True, True]
    assert reported[-1].finished, "the grammar's end token ends the row"
    assert row.run == ()
    assert not row.told


def test_the_budget_and_the_pass_cut_a_run() -> None:
    budget = row_after([], (7, 8, 9, 10), remaining=3)
    assert budget.take_run(7, STOP, limit=32) == (8, 9)
    assert budget.leaving(7, STOP)
    assert [t.finished for t in budget.reported(7, 0.25, STOP)] == [False, False, True]
    passed = row_after([], (7, 8, 9, 10), remaining=10)
    assert passed.take_run(7, STOP, limit=1) == (8,)
    assert not passed.leaving(7, STOP)


def test_a_first_step_reports_only_its_run_and_tells_nothing_twice() -> None:
    """Prefill reported and told the first token: the step after feeds it, not again."""
    row = row_after([7], (7, 8, 9), remaining=5)
    row.has_output = False
    assert row.take_run(7, STOP, limit=32) == (8, 9, EOS)
    reported = row.reported(7, 0.25, STOP)
    assert [t.token for t in reported] == [8, 9, EOS]
    assert [t.together for t in reported] == [False, True, True]


def test_no_run_after_a_stop_token() -> None:
    row = row_after([7, 8], (7, 8), remaining=5)
    assert row.take_run(EOS, STOP, limit=32) == ()
    assert row.leaving(EOS, STOP)
