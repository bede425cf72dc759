"""Shared test configuration."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from reliability.services.postgres import PostgresServer

from semantic.adapters.mlx.cpu import prepare_process

prepare_process()  # OpenBLAS in scope, on its best core, before anything imports MLX

ALONE_CHOICES = ("with", "without", "only")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--alone",
        choices=ALONE_CHOICES,
        default="with",
        help="tests marked alone (they bound a latency): run them with the others (default),"
        " leave them out (the parallel pass of scripts/test.sh), or run only them",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--alone``: a parallel pass leaves the latency-bound tests to a pass of their own."""
    choice = config.getoption("--alone")
    if choice == "with":
        return
    wanted = choice == "only"
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        (kept if (item.get_closest_marker("alone") is not None) == wanted else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server of the run's own (started at its first use, ~1 s); each test
    makes its own database on it."""
    with PostgresServer() as server:
        yield server
