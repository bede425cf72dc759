"""Refuse to run on an mlx-lm version this release has not been tested with.

The engine composes mlx-lm's model code and batch cache classes (``BatchKVCache`` and its
kin), whose behaviour changes between minor releases (FACTS.md lists what 0.32 does). A
silent mismatch would show up as wrong tokens, so we stop with a clear message instead.
"""

from __future__ import annotations

import os
import re
from importlib import metadata

from semantic.adapters.mlx.errors import UnsupportedRuntimeError

TESTED_MLX_LM = ((0, 32, 2), (0, 33, 0))
"""Tested mlx-lm versions: at least the first, below the second."""

OVERRIDE_ENV = "SEMANTIC_ALLOW_UNTESTED_MLX_LM"


def check_mlx_lm_version(installed: str | None = None) -> str:
    """Return the installed mlx-lm version, or raise if it is outside the tested range."""
    version = installed or metadata.version("mlx-lm")
    if os.environ.get(OVERRIDE_ENV) == "1":
        return version
    low, high = TESTED_MLX_LM
    if not low <= _parse(version) < high:
        tested = f">={_show(low)},<{_show(high)}"
        raise UnsupportedRuntimeError(
            f"mlx-lm {version} is installed, but semantic is tested with mlx-lm {tested}. "
            f"Fix: pip install 'mlx-lm{tested}' (or set {OVERRIDE_ENV}=1 to run anyway, at "
            "your own risk)."
        )
    return version


def _parse(version: str) -> tuple[int, ...]:
    parts = [int(m.group()) if (m := re.match(r"\d+", p)) else 0 for p in version.split(".")[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


def _show(version: tuple[int, ...]) -> str:
    return ".".join(str(p) for p in version)
