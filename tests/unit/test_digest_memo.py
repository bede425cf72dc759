"""The weights' digest is read once per version of the files, and never reused for others."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from semantic.adapters.mlx.models.digest_memo import KEPT, SETTLED_NS, DigestMemo


class CountingDigest:
    """The files' bytes joined, counting how often they were read."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self, paths: Sequence[Path]) -> str:
        self.reads += 1
        return "|".join(path.read_bytes().hex() for path in paths)


def later() -> int:
    """A clock by which the files written now have settled."""
    return time.time_ns() + 2 * SETTLED_NS


@pytest.fixture
def weights(tmp_path: Path) -> list[Path]:
    paths = [tmp_path / "model-1.safetensors", tmp_path / "model-2.safetensors"]
    for index, path in enumerate(paths):
        path.write_bytes(bytes([index]) * 64)
    return paths


def test_settled_files_are_read_once_while_they_stay_as_they_are(
    tmp_path: Path, weights: list[Path]
) -> None:
    compute = CountingDigest()
    first = DigestMemo(tmp_path / "digests", later).digest(weights, compute)
    assert DigestMemo(tmp_path / "digests", later).digest(weights, compute) == first  # a restart
    assert first == CountingDigest()(weights)
    assert compute.reads == 1


def test_files_changed_just_now_are_read_every_time(tmp_path: Path, weights: list[Path]) -> None:
    compute = CountingDigest()
    memo = DigestMemo(tmp_path / "digests")  # the real clock: the files are seconds old at most
    assert memo.digest(weights, compute) == memo.digest(weights, compute)
    assert compute.reads == 2


def test_a_rewrite_that_keeps_size_and_modification_time_is_read_again(
    tmp_path: Path, weights: list[Path]
) -> None:
    compute = CountingDigest()
    memo = DigestMemo(tmp_path / "digests", later)
    before = memo.digest(weights, compute)
    status = weights[1].stat()
    while weights[1].stat().st_ctime_ns == status.st_ctime_ns:  # the kernel's clock is coarse
        weights[1].write_bytes(b"\xff" * 64)
    os.utime(weights[1], ns=(status.st_atime_ns, status.st_mtime_ns))  # as a copy tool would
    after = memo.digest(weights, compute)
    assert after != before
    assert after == CountingDigest()(weights)
    assert compute.reads == 2


def test_a_memo_that_cannot_be_written_still_gives_the_digest(
    tmp_path: Path, weights: list[Path]
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    compute = CountingDigest()
    memo = DigestMemo(blocked / "digests", later)
    assert memo.digest(weights, compute) == memo.digest(weights, compute) == compute(weights)
    assert compute.reads == 3


def test_only_the_newest_digests_are_kept(tmp_path: Path) -> None:
    memo = DigestMemo(tmp_path / "digests", later)
    models = []
    seen: set[Path] = set()
    for index in range(KEPT + 3):
        path = tmp_path / f"model-{index}.safetensors"
        path.write_bytes(bytes([index]))
        memo.digest([path], CountingDigest())
        models.append(path)
        for entry in set((tmp_path / "digests").glob("*.digest")) - seen:  # distinct ages
            os.utime(entry, ns=(index * SETTLED_NS, index * SETTLED_NS))
            seen.add(entry)
    assert len(list((tmp_path / "digests").glob("*.digest"))) == KEPT
    compute = CountingDigest()
    memo.digest([models[-1]], compute)  # the newest is still known
    assert compute.reads == 0
