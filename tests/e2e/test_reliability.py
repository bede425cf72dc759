"""Short versions of the reliability suites (``python -m reliability`` runs them in full)."""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability import corruption, crash_load, fuzz, isolation, load

pytestmark = pytest.mark.model


def test_load_serves_every_turn_and_keeps_every_transcript(tmp_path: Path) -> None:
    result = load.run(agents=4, turns=2, workdir=tmp_path, kv_budget_mb=512)
    assert result.failures == []
    assert result.server_errors == 0
    assert result.transcripts_lost == 0
    assert result.requests == 4 * 3


def test_a_kill_under_load_loses_no_acknowledged_reply(tmp_path: Path) -> None:
    result = crash_load.run(kills=1, agents=2, workdir=tmp_path)
    assert result.failures == []
    assert result.survived == 1


def test_every_kind_of_corruption_is_detected_and_answered_correctly(tmp_path: Path) -> None:
    result = corruption.run(rounds=1, workdir=tmp_path)
    assert result.failures == []
    assert result.detected == result.injected == result.answered_correctly == 4


def test_fuzzed_requests_never_cause_a_server_error(tmp_path: Path) -> None:
    result = fuzz.run(examples=3, workdir=tmp_path)
    assert result.failures == []
    assert result.server_errors == 0
    assert result.cases > 50


def test_ids_tenants_and_the_api_key_are_isolated(tmp_path: Path) -> None:
    result = isolation.run(tmp_path)
    assert result.failures == []
    assert result.refused == result.tried
