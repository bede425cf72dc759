"""A full disk costs cached KV, never transcripts or service (issue 32), on a real server
whose data directory is a 64 MiB tmpfs (``reliability.full_disk`` runs the same, printing
its figures)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from reliability import full_disk

pytestmark = pytest.mark.model


def scenario(run: Callable[[Path, int, full_disk.Result], None], workdir: Path) -> full_disk.Result:
    result = full_disk.Result()
    try:
        run(workdir, 64, result)
    except full_disk.MountRefusedError as error:
        pytest.skip(f"no tmpfs can be mounted here ({error}); these scenarios need root")
    return result


def test_a_disk_another_program_fills_costs_blocks_then_refuses_turns_clearly(
    tmp_path: Path,
) -> None:
    """Turns and new agents answer on the full disk (blocks evicted, transcripts whole); with
    the disk kept full and nothing of ours left, a turn gets a 507 naming the disk, shown by
    /health and the metrics, keeping nothing, while plain requests answer; /ready says 503
    and HAProxy (the shipped configuration) takes the instance out of rotation; once space
    returns it is back in rotation and the next turn answers without a restart. No partial
    file is left."""
    result = scenario(full_disk.others, tmp_path)
    assert result.failures == []
    assert result.blocks_evicted > 0
    assert result.turns_refused == 1
    assert "/others/data" in result.refusal
    assert result.recovery_s is not None
    assert result.out_of_rotation_s is not None  # HAProxy's /ready check, within its limit
    assert result.back_in_rotation_s is not None


def test_a_disk_the_servers_own_blocks_fill_keeps_its_reserve_and_answers(
    tmp_path: Path,
) -> None:
    """With --disk-reserve-mb 20, two agents' blocks would fill the disk: older blocks give
    way, every turn answers, also after a restart, and the reserve stays free."""
    result = scenario(full_disk.ours, tmp_path)
    assert result.failures == []
    assert result.turns_answered == 7
    assert result.turns_refused == 0
    assert result.blocks_evicted > 0
    assert min(free for _, free in result.free_mb) >= 20
