"""A real Redis for the shared block tier's tests: one process per test run, emptied before
each test that asks for it (conftests import these fixtures)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from reliability.services.redis import RedisServer, redis_server_binary


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if redis_server_binary() is None:
        pytest.fail("redis-server is not installed: scripts/setup.sh installs it")
    server = RedisServer(Path(tmp_path_factory.mktemp("redis")))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session's Redis, emptied."""
    with redis.Redis.from_url(redis_server.url) as client:
        client.flushdb()
    return redis_server.url
