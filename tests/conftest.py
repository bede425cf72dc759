"""Shared test configuration."""

from __future__ import annotations

import semantic.adapters.mlx  # noqa: F401 - puts OpenBLAS in scope before anything imports MLX
