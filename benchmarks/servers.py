"""The server as the benchmarks start it: its weights on huge pages before it answers.

A server moves its weights onto huge pages once it is up, in its idle time (ADR 0032);
measured while they move, a row would mix two speeds. The benchmarks measure steady
states, so theirs waits for the move at load (``SEMANTIC_HUGE_PAGES=at-load``), as every
server did before the move went into the background.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reliability.server import ServerProcess

from semantic.adapters.mlx.cpu.huge_pages import AT_LOAD, HUGE_PAGES_ENV


def steady_server(data_dir: Path, *args: str, **options: Any) -> ServerProcess:
    """``ServerProcess(data_dir, *args, **options)``, its weights placed at load."""
    env = {HUGE_PAGES_ENV: AT_LOAD, **(options.pop("env", None) or {})}
    return ServerProcess(data_dir, *args, env=env, **options)
