"""Everything that touches mlx and mlx-lm lives in this package.

Importing it first puts a fast BLAS in the process's global symbol scope, because MLX's
CPU matmuls bind to whatever BLAS is visible when ``mlx.core`` loads (ADR 0004). That is
the one piece of import-time work in the codebase, and it is idempotent.
"""

from semantic.adapters.mlx.blas import preload_fast_blas

preload_fast_blas()
