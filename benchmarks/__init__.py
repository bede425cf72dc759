"""Benchmark scripts that print numbers; run each with ``python -m benchmarks.<name>``."""

from semantic.adapters.mlx.cpu import prepare_process

prepare_process()  # OpenBLAS (on its best core) and malloc tuning before anything loads MLX
