"""Ready this process for MLX: the one step the command line calls before MLX loads.

MLX's CPU matmuls bind to whatever BLAS is in the global symbol scope when ``mlx.core``
loads (ADR 0004), freed KV memory is only reused at copy speed with malloc tuned (memory.py),
and MLX's JIT builds kernels for this CPU only when its compiler is ours (ADR 0012). Each
part changes the process, so none of it happens on import: callers ask, once, before the
first ``import mlx.core``. Each part falls back on its own and has its switch:
``SEMANTIC_BLAS_LIBRARY`` / ``SEMANTIC_BLAS_SHIM`` / ``SEMANTIC_BLAS_CORE_CHOICE`` /
``SEMANTIC_PIN_HELPERS`` (blas.py), ``SEMANTIC_MALLOC_TUNING`` (memory.py),
``SEMANTIC_MLX_JIT_NATIVE`` (jit.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from semantic.adapters.mlx.cpu.blas import BlasStatus, preload_fast_blas
from semantic.adapters.mlx.cpu.jit import use_native_jit
from semantic.adapters.mlx.cpu.memory import tune_malloc


@dataclass(frozen=True, slots=True)
class PreparedProcess:
    blas: BlasStatus
    malloc_tuned: bool
    native_jit: bool


@functools.cache
def prepare_process() -> PreparedProcess:
    """Idempotent; the order matters: malloc before large allocations, BLAS before MLX."""
    malloc_tuned = tune_malloc()
    blas = preload_fast_blas()
    return PreparedProcess(blas, malloc_tuned, use_native_jit())
