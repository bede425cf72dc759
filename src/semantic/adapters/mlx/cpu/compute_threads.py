"""How many threads MLX's products run on, and the switch that gives two threads of work a
core each (a decode step's body beside a prompt's slice, ADR 0015): OpenBLAS's thread count
and our kernels' helper (``native/small_sgemm.c``), set together between products."""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass

from semantic.adapters.mlx.cpu.blas import global_provider, preload_fast_blas


@dataclass(frozen=True, slots=True)
class ComputeThreads:
    """How many threads the products use: OpenBLAS's count, and our kernels' helper."""

    _blas: ctypes.CDLL
    _shim: ctypes.CDLL
    normal: int
    """OpenBLAS's thread count as the process runs it."""

    def one_each(self) -> None:
        """A thread's products run on it alone: two threads of work, a core each. Call it
        only between products (OpenBLAS's count must not change while one runs)."""
        self._shim.semantic_set_helper_enabled(0)
        self._blas.openblas_set_num_threads(1)

    def restore(self) -> None:
        self._blas.openblas_set_num_threads(self.normal)
        self._shim.semantic_set_helper_enabled(1)


def allowed_cpus() -> int:
    """CPUs this process may run on (its affinity: ``taskset``, a cgroup's cpuset)."""
    return len(os.sched_getaffinity(0))


@functools.cache
def compute_threads() -> ComputeThreads | None:
    """The switch for running two threads of work side by side; None unless OpenBLAS with
    our kernels (and their helper) is what MLX's products run on, on two CPUs or more."""
    if allowed_cpus() < 2:
        return None
    status = preload_fast_blas()
    if not (status.small_kernels and status.path and "openblas" in status.path.lower()):
        return None
    provider = global_provider("cblas_sgemm")
    if provider is None:
        return None
    blas = ctypes.CDLL(status.path, mode=os.RTLD_NOLOAD)
    shim = ctypes.CDLL(provider, mode=os.RTLD_NOLOAD)
    if not (
        hasattr(blas, "openblas_set_num_threads") and hasattr(shim, "semantic_set_helper_enabled")
    ):
        return None
    return ComputeThreads(blas, shim, int(blas.openblas_get_num_threads()))
