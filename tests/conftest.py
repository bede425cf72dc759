"""Shared test configuration."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from reliability.services.postgres import PostgresServer

from semantic.adapters.mlx.cpu import prepare_process

prepare_process()  # OpenBLAS in scope, on its best core, before anything imports MLX


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server of the run's own (started at its first use, ~1 s); each test
    makes its own database on it."""
    with PostgresServer() as server:
        yield server
