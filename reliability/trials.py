"""What the kill -9 suites share: trials on one scratch data directory, and their report."""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path


def each_trial(
    trials: int,
    seed: int,
    workdir: Path | None,
    one: Callable[[Path, int, random.Random], None],
) -> None:
    """``one(data_dir, index, rng)`` per trial, all on one data directory (each trial
    restarts the server on what the last one's kill left) with one seeded generator."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        data_dir = Path(tmp) / "data"
        for index in range(trials):
            one(data_dir, index, rng)


def print_failures(failures: Sequence[str], shown: int = 20) -> None:
    print(f"failures: {len(failures)}")
    for failure in failures[:shown]:
        print("  " + failure)
