"""The block ``semantic serve`` prints once it serves: where it listens, the model, the
device, the BLAS library and its core, and which fast paths run (and why not). Printed with
default settings, because a server that says nothing at start leaves its user guessing
whether it runs, and on what; ``--quiet`` leaves it out."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from semantic import __version__


def start_block(url: str, model_id: str, runtime: Mapping[str, Any], data_dir: Path) -> str:
    """``runtime``: what ``GET /v1/models/{id}`` serves (device, blas, accelerations)."""
    lines = [
        f"semantic {__version__} serving {model_id} on {url}",
        f"  device      {runtime.get('device', '?')}",
        f"  BLAS        {runtime.get('blas', '?')}",
        f"  data        {data_dir}",
        f"  dashboard   {url}/dashboard",
        "  fast paths",
    ]
    accelerations: Mapping[str, str] = runtime.get("accelerations", {})
    lines += [f"    {name}: {state}" for name, state in accelerations.items()]
    return "\n".join(lines) + "\n"
