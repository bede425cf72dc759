"""Choose the BLAS MLX runs on, and say which one it got.

The mlx-cpu wheel for Linux bundles the netlib reference BLAS (about 5-7 GFLOP/s here);
OpenBLAS runs the same matmuls at about 300 GFLOP/s. MLX binds its ``cblas_*`` symbols to
whatever is in the process's global scope when ``mlx.core`` loads, so we load OpenBLAS with
``RTLD_GLOBAL`` first. In front of it goes a small ``cblas_sgemm`` (``native/sgemm_gemv.c``,
compiled once per machine) that sends one-row products to ``cblas_sgemv``: OpenBLAS's
sgemm packs the whole weight matrix even for one row, which makes decode 3x slower.
Decision and alternatives: docs/adr/0004-fast-blas-on-linux.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

BLAS_ENV = "SEMANTIC_BLAS_LIBRARY"
"""Path of the BLAS shared library to use instead of searching for OpenBLAS; ``none``
keeps MLX's bundled reference BLAS."""
SHIM_ENV = "SEMANTIC_BLAS_GEMV_SHIM"
"""``0`` turns the one-row sgemm -> sgemv shim off."""
SHIM_SOURCE = Path(__file__).parent / "native" / "sgemm_gemv.c"


@dataclass(frozen=True, slots=True)
class BlasStatus:
    name: str
    path: str | None
    fast: bool
    gemv_shim: bool = False


@functools.cache
def preload_fast_blas() -> BlasStatus:
    """Put OpenBLAS (and the gemv shim in front of it) in scope before MLX loads.

    Cached: this can only work once per process, and only before ``mlx.core`` is imported.
    """
    if not sys.platform.startswith("linux"):
        return BlasStatus("Accelerate/Metal", None, fast=True)
    choice = os.environ.get(BLAS_ENV, "").strip()
    if choice.lower() == "none":
        return BlasStatus("reference BLAS (SEMANTIC_BLAS_LIBRARY=none)", None, fast=False)
    if "mlx.core" in sys.modules:
        log.warning("mlx.core was imported before semantic.adapters.mlx; BLAS left as it is")
        return blas_in_use()
    path = choice or ctypes.util.find_library("openblas")
    if not path:
        return BlasStatus("reference BLAS", None, fast=False)
    shim = os.environ.get(SHIM_ENV, "1") != "0" and _load_shim(path)
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as error:
        log.warning("could not load BLAS library %s: %s", path, error)
        return BlasStatus("reference BLAS", None, fast=False)
    status = blas_in_use()
    return BlasStatus(status.name, status.path, status.fast, gemv_shim=shim)


def blas_in_use() -> BlasStatus:
    """Tell which library MLX's ``cblas_sgemm`` resolves to: the first one in global scope.

    MLX's own bundled BLAS is loaded privately, so if no global library provides the symbol,
    MLX runs on the reference BLAS.
    """
    provider = _global_provider("cblas_sgemm")
    if provider is None:
        return BlasStatus("reference BLAS (bundled with mlx-cpu)", None, fast=False)
    shim = "semantic_sgemm_gemv" in os.path.basename(provider)
    if shim:
        provider = _global_provider("cblas_sgemv") or provider
    name = "OpenBLAS" if "openblas" in os.path.basename(provider).lower() else "BLAS"
    return BlasStatus(name, provider, fast=True, gemv_shim=shim)


class _DlInfo(ctypes.Structure):
    _fields_ = (
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    )


def _global_provider(symbol: str) -> str | None:
    """Path of the library that defines ``symbol`` in the process's global scope."""
    try:
        address = ctypes.cast(getattr(ctypes.CDLL(None), symbol), ctypes.c_void_p)
    except AttributeError:
        return None
    info = _DlInfo()
    if not ctypes.CDLL(None).dladdr(address, ctypes.byref(info)) or not info.dli_fname:
        return None
    return str(info.dli_fname.decode())


def report_blas() -> BlasStatus:
    """Log which BLAS MLX uses; warn when it is the slow reference one."""
    status = preload_fast_blas()
    if status.fast:
        shim = ", one-row products via sgemv" if status.gemv_shim else ""
        log.info("BLAS: %s (%s%s)", status.name, status.path or "system", shim)
    else:
        log.warning(
            "BLAS: %s; matmuls run about 30x slower. Install OpenBLAS "
            "(Debian/Ubuntu: apt-get install libopenblas0-pthread) and restart.",
            status.name,
        )
    return status


def native_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("SEMANTIC_NATIVE_CACHE", Path(base) / "semantic" / "native"))


def _load_shim(blas_path: str) -> bool:
    """Build (once) and load the shim ahead of OpenBLAS; False if that is not possible."""
    try:
        library = _build_shim(blas_path)
        if library is None:
            return False
        local = ctypes.CDLL(str(library), mode=ctypes.RTLD_LOCAL)
        if not local.semantic_blas_shim_ready():
            log.warning("gemv shim could not find cblas_sgemv in %s; not using it", blas_path)
            return False
        ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL | os.RTLD_NOLOAD)
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("gemv shim unavailable (%s); decode will be slower", error)
        return False
    return True


def _build_shim(blas_path: str) -> Path | None:
    source = SHIM_SOURCE.read_bytes()
    key = hashlib.sha256(source + blas_path.encode()).hexdigest()[:16]
    target = native_cache_dir() / f"libsemantic_sgemm_gemv-{key}.so"
    if target.exists():
        return target
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        log.info("no C compiler found; running without the gemv shim")
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        define = f'-DBLAS_TARGET="{blas_path}"'
        command = [compiler, "-O2", "-shared", "-fPIC", define, "-o", str(built), str(SHIM_SOURCE)]
        subprocess.run([*command, "-ldl"], check=True, capture_output=True, timeout=120)
        os.replace(built, target)
    return target
