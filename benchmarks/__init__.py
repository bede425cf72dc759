"""Benchmark scripts that print numbers; run each with ``python -m benchmarks.<name>``."""

import semantic.adapters.mlx  # noqa: F401 - OpenBLAS and malloc tuning before anything loads MLX
