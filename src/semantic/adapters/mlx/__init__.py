"""Everything that touches mlx and mlx-lm lives in this package.

Importing it does nothing to the process. The work MLX needs done before it loads (a fast
BLAS in the global symbol scope, malloc tuning, native kernels for MLX's JIT) is one
explicit call, ``semantic.adapters.mlx.cpu.prepare_process()``, made by the command
line, the benchmarks and the tests before anything imports ``mlx.core``.
"""
