"""One shared server for the end-to-end tests; tests that restart get their own."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from reliability.server import ServerProcess


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("served")).start()
    yield process
    assert process.stop() == 0, "SIGTERM must give a clean exit"


@pytest.fixture
def new_server(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    started: list[ServerProcess] = []

    def start(*args: str, data_dir: Path | None = None) -> ServerProcess:
        process = ServerProcess(data_dir or tmp_path / "data", *args).start()
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
