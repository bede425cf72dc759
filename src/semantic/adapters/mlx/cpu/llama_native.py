"""The loaded ``native/llama_pass.c``: the host pass and the weight product live there.

Built on first use for this CPU (``native_build``), and only where our batch-invariant
matmul kernel answers for ``cblas_sgemm`` (ADR 0010): every product in it goes there.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import subprocess

from semantic.adapters.mlx.cpu.native_build import NATIVE_DIR, build_library

log = logging.getLogger(__name__)

HOST_PASS_ENV = "SEMANTIC_HOST_PASS"
"""``0``: every pass on MLX, quantized products too."""


def wanted() -> bool:
    return os.environ.get(HOST_PASS_ENV) != "0"


@functools.cache
def native_library() -> ctypes.CDLL | None:
    """None when turned off, without a compiler or without our matmul kernel."""
    if not wanted() or not small_kernels_loaded():
        return None
    try:
        path = build_library(NATIVE_DIR / "llama_pass.c", "libsemantic_llama_pass")
        return None if path is None else ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("host pass unavailable (%s); small passes run on MLX", error)
        return None


def small_kernels_loaded() -> bool:
    """Our batch-invariant matmul kernel answers for ``cblas_sgemm`` (ADR 0010)."""
    try:
        probe = ctypes.CDLL(None).semantic_blas_small_kernels
    except AttributeError:
        return False
    probe.restype = ctypes.c_int
    return bool(probe())
