"""Shared test configuration."""

from __future__ import annotations

from semantic.adapters.mlx.process import prepare_process

prepare_process()  # OpenBLAS in scope, on its best core, before anything imports MLX
