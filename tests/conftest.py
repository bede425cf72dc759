"""Shared test configuration."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

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
    parser.addoption(
        "--alone-left",
        type=Path,
        default=None,
        help="with --alone without: write there the ids of the tests it left out (so the"
        " pass for them runs only where there are some)",
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
    left: Path | None = config.getoption("--alone-left")
    if left is not None and not wanted:  # every worker collects alike: the same lines
        written = left.with_name(f"{left.name}.{os.getpid()}")
        written.write_text("".join(f"{item.nodeid}\n" for item in dropped))
        written.replace(left)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server of the run's own (started at its first use, ~1 s); each test
    makes its own database on it."""
    with PostgresServer() as server:
        yield server
