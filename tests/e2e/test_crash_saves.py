"""A short run of the crash suites: one trial each (``python -m reliability.crash_saves``
and ``reliability.crash_responses`` run 50 and 20)."""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability.crash_responses import run as responses_run
from reliability.crash_saves import run

pytestmark = pytest.mark.model


def test_kill_9_during_saves_loses_nothing_acknowledged(tmp_path: Path) -> None:
    summary = run(trials=1, agents=2, seed=7, workdir=tmp_path)
    assert summary.failures == []
    assert summary.survived == summary.trials == 1
    assert summary.checked_agents > 0


def test_kill_9_loses_no_acknowledged_response(tmp_path: Path) -> None:
    summary = responses_run(trials=1, chains=2, seed=7, workdir=tmp_path)
    assert summary.failures == []
    assert summary.survived == summary.trials == 1
    assert summary.checked_chains > 0
