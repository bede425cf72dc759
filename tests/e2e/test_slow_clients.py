"""A slow-client flood against the real server (``python -m reliability`` runs it longer)."""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability import slow_clients

pytestmark = [pytest.mark.model, pytest.mark.alone]


def test_a_slow_client_flood_leaves_ordinary_requests_answered_and_the_log_small(
    tmp_path: Path,
) -> None:
    """2,500 sockets (more than the server's 2,048 descriptors) that never finish a request,
    for 8 s: /health and a short chat completion are each answered within 2 s throughout,
    the slow sockets are closed (408, at their deadline or to make room), and the log stays
    under 1 MB with no "Too many open files"."""
    result = slow_clients.run(
        sockets=2500,
        seconds=8,
        workdir=tmp_path,
        header_timeout_s=3,
        body_timeout_s=5,
        before_rounds=2,
    )
    print("\n".join(slow_clients.summary(result)))
    assert result.failures == []
    assert result.during_flood >= 4
    assert result.descriptor_limit_line.endswith("raised from 1024 to 2048")
    assert result.descriptor_limit_serving == 2048, "loading the model code kept it"
    assert result.answered.get("408", 0) > 0
    assert result.log_bytes < 1 << 20
    assert result.too_many_open_files == 0
