"""mlx-lm's import-time ``setrlimit`` may raise the descriptor limit, never lower it."""

from __future__ import annotations

import resource
from collections.abc import Iterator

import pytest

from semantic.adapters.cli.descriptors import raise_descriptor_limit
from semantic.adapters.mlx.import_guards import descriptor_limit_only_raised


@pytest.fixture
def kept_limit() -> Iterator[tuple[int, int]]:
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, before[1]))
    yield before
    resource.setrlimit(resource.RLIMIT_NOFILE, before)


def test_a_lower_limit_asked_for_during_the_import_is_not_set(
    kept_limit: tuple[int, int],
) -> None:
    hard = kept_limit[1]
    with descriptor_limit_only_raised():
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 200))  # what mlx-lm does, lower
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (256, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (300, hard + 1))  # higher: soft only
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (300, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (200, hard))
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (200, hard), "the real one is back"


def test_the_soft_limit_is_raised_to_the_hard_one(kept_limit: tuple[int, int]) -> None:
    limit = raise_descriptor_limit()
    assert (limit.before, limit.now) == (256, kept_limit[1])
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == kept_limit[1]
    assert limit.connections_allowed < limit.now
