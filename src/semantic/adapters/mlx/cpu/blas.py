"""Choose the BLAS MLX runs on, and say which one it got.

The mlx-cpu wheel for Linux bundles the netlib reference BLAS: a 1024x1024 float32 matmul
ran at 5-7 GFLOP/s on a 2-core AVX-512 Xeon VM, about 300 with OpenBLAS (ADR 0004; SmolLM2's
600-row layer products on OpenBLAS's Zen core reach 105-110 on a 2-core Zen 3). MLX binds
its ``cblas_*`` symbols to whatever is in the process's global scope when ``mlx.core``
loads, so we load OpenBLAS with ``RTLD_GLOBAL`` first. In front of it goes our own
``cblas_sgemm`` (``native/small_sgemm.c``, compiled once per machine for its CPU) with
kernels for products of up to 32 rows, the decode steps: OpenBLAS's sgemm packs the whole
weight matrix first, which made one-row decode 3x slower and 16 rows cost as much as 32.
Decisions and alternatives: docs/adr/0004-fast-blas-on-linux.md,
docs/adr/0010-small-batch-matmul-kernel.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from semantic.adapters.mlx.cpu.blas_core import (
    CORETYPE_ENV,
    CoreDecision,
    CoreReason,
    prompt_products_ours,
    user_core,
    wider_core,
)
from semantic.adapters.mlx.cpu.blas_probe import decide_core, this_cpus_flags
from semantic.adapters.mlx.cpu.native_build import NATIVE_DIR, build_library

log = logging.getLogger(__name__)

BLAS_ENV = "SEMANTIC_BLAS_LIBRARY"
"""Path of the BLAS shared library to use instead of searching for OpenBLAS; ``none``
keeps MLX's bundled reference BLAS."""
SHIM_ENV = "SEMANTIC_BLAS_SHIM"
"""``0`` turns our small-product ``cblas_sgemm`` off: every product goes to OpenBLAS."""
PIN_ENV = "SEMANTIC_PIN_HELPERS"
"""``0`` leaves the placement of BLAS helper threads to the OS scheduler."""
CORE_CHOICE_ENV = "SEMANTIC_BLAS_CORE_CHOICE"
"""``0`` keeps the OpenBLAS core the library detects, even a generic fallback."""
CORE_CHOSEN_ENV = "SEMANTIC_BLAS_CORE_CHOSEN"
"""The core ``preload_fast_blas`` put in ``OPENBLAS_CORETYPE`` (children inherit both)."""
PROMPT_PRODUCTS_ENV = "SEMANTIC_PROMPT_PRODUCTS"
"""``ours`` or ``openblas``: who computes a prompt's products past 32 rows; unset, ours
where OpenBLAS's core is narrower than our kernel variant (``prompt_products_ours``)."""
PROMPT_PRODUCTS_NAME = "prompt-products-by-dot-tiles-v1"
"""Goes into the model fingerprint where a prompt's products are ours: they round as the
dot tiles sum, not as OpenBLAS's kernels, so KV computed either way is not mixed."""
SHIM_SOURCE = NATIVE_DIR / "small_sgemm.c"
SHIM_NAME = "libsemantic_small_sgemm"


INSTALL_OPENBLAS = (
    "Install OpenBLAS (Debian/Ubuntu: apt-get install libopenblas0-pthread) and restart."
)
IMPORT_FIRST = (
    "Call semantic.adapters.mlx.cpu.prepare_process() before importing mlx.core: the fast"
    " BLAS can only be put in front then."
)


@dataclass(frozen=True, slots=True)
class BlasStatus:
    name: str
    path: str | None
    fast: bool
    shim: bool = False
    """Our ``cblas_sgemm`` is in front of the library."""
    small_kernels: bool = False
    """...and was built with its small-product kernels (a variant with fused multiply-add;
    without them it only sends up to three rows to sgemv)."""
    remedy: str = INSTALL_OPENBLAS
    """What to do when it is slow."""
    version: str | None = None
    core: CoreDecision | None = None
    """OpenBLAS's kernel set (its "core") and why it is the one."""
    compiler: str | None = None
    """The C compiler that built our shim, as the shim reports it (``__VERSION__``)."""
    variant: str | None = None
    """The kernel variant the shim was built as (``avx512``, ``avx2``, ``neon``,
    ``baseline``), as the shim reports it."""
    prompt_products: bool = False
    """A prompt's products past 32 rows (x @ W^T) run on our kernels too."""

    def describe(self) -> str:
        """One line: the library, its version, where it was found, the core and why."""
        name = f"{self.name} {self.version}" if self.version else self.name
        parts = [self.path or "system"]
        if self.core is not None and self.core.core is not None:
            parts.append(self.core.describe())
        if self.small_kernels:
            past = ", and a prompt's x @ W^T past them" if self.prompt_products else ""
            parts.append(f"products of up to 32 rows{past} by our own {self.variant} kernels")
        elif self.shim:
            parts.append("up to three rows via sgemv (our kernels are off: the fast paths say why)")
        return f"{name} ({'; '.join(parts)})"

    @property
    def generic_core(self) -> bool:
        return self.core is not None and self.core.generic


@functools.cache
def preload_fast_blas() -> BlasStatus:
    """Put OpenBLAS (and our small-product sgemm in front of it) in scope before MLX loads.

    Cached: this can only work once per process, and only before ``mlx.core`` is imported.
    """
    if not sys.platform.startswith("linux"):
        return BlasStatus("Accelerate/Metal", None, fast=True)
    choice = os.environ.get(BLAS_ENV, "").strip()
    if choice.lower() == "none":
        return BlasStatus("reference BLAS (SEMANTIC_BLAS_LIBRARY=none)", None, fast=False)
    if "mlx.core" in sys.modules:
        log.warning("mlx.core was imported before prepare_process(); BLAS left as it is")
        return replace(blas_in_use(), remedy=IMPORT_FIRST)
    path = choice or ctypes.util.find_library("openblas")
    if not path:
        return BlasStatus("reference BLAS", None, fast=False)
    decision = _choose_core(path)
    threads_before = _thread_ids()
    shim = _load_shim(path) if os.environ.get(SHIM_ENV, "1") != "0" else None
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as error:
        log.warning("could not load BLAS library %s: %s", path, error)
        return BlasStatus("reference BLAS", None, fast=False)
    _keep_helpers_off_the_callers_core(sorted(_thread_ids() - threads_before), shim)
    status = blas_in_use(decision.reason)
    if shim is not None and status.small_kernels and _prompt_products_wanted(status):
        shim.semantic_set_prompt_products(1)
        status = replace(status, prompt_products=True)
    return status


def _prompt_products_wanted(status: BlasStatus) -> bool:
    asked = os.environ.get(PROMPT_PRODUCTS_ENV, "").strip().lower()
    if asked in ("ours", "openblas"):
        return asked == "ours"
    if asked:
        log.warning("%s=%s: ours or openblas; deciding by the cores", PROMPT_PRODUCTS_ENV, asked)
    core = status.core.core if status.core is not None else None
    return prompt_products_ours(core, status.variant)


def _choose_core(library: str) -> CoreDecision:
    """Put the best working core in ``OPENBLAS_CORETYPE`` where OpenBLAS would fall back to
    a generic one; the user's own setting always stands."""
    if os.environ.get(CORE_CHOICE_ENV) == "0" and user_core(os.environ) is None:
        return CoreDecision(None, CoreReason.DETECTED)
    decision, coretype = decide_core(library, os.environ, this_cpus_flags())
    if coretype is not None:
        os.environ[CORETYPE_ENV] = coretype
        os.environ[CORE_CHOSEN_ENV] = coretype  # a child then knows it was not the user's
    return decision


def _thread_ids() -> set[int]:
    try:
        return {int(name) for name in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def _keep_helpers_off_the_callers_core(blas_workers: list[int], shim: ctypes.CDLL | None) -> None:
    """Put OpenBLAS's worker threads (the threads its loading started) on every allowed CPU
    but the first, and our helper on the last of those CPUs (beside a worker whenever there
    is one).

    Each of them only ever helps the thread that called sgemm, so they never need a core at
    the same time; but OpenBLAS's workers spin between calls, and on two cores the scheduler
    sometimes gave the spinner a core of its own, leaving the caller and our helper half a
    core each: a 26-token pass at 4,178 positions then took 225 ms instead of 145, at random.
    ``SEMANTIC_PIN_HELPERS=0`` leaves placement to the scheduler.
    """
    if os.environ.get(PIN_ENV) == "0":
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return  # and the shim starts no helper
    spare = cpus[1:]
    for index, thread in enumerate(blas_workers):
        try:
            os.sched_setaffinity(thread, {spare[index % len(spare)]})
        except OSError:
            continue  # gone already, or not ours to move
    if shim is not None:
        shim.semantic_set_helper_cpu(spare[min(len(blas_workers), len(spare)) - 1])


def blas_in_use(reason: CoreReason | None = None) -> BlasStatus:
    """Tell which library MLX's ``cblas_sgemm`` resolves to: the first one in global scope,
    and, for OpenBLAS, its version and the core it runs on.

    MLX's own bundled BLAS is loaded privately, so if no global library provides the symbol,
    MLX runs on the reference BLAS.
    """
    provider = global_provider("cblas_sgemm")
    if provider is None:
        return BlasStatus("reference BLAS (bundled with mlx-cpu)", None, fast=False)
    shim = SHIM_NAME in os.path.basename(provider)
    kernels, compiler, variant, prompt = False, None, None, False
    if shim:
        kernels, compiler, variant, prompt = _shim_build(provider)
        provider = global_provider("cblas_sgemv") or provider
    if "openblas" not in os.path.basename(provider).lower():
        return BlasStatus(
            "BLAS",
            provider,
            True,
            shim,
            kernels,
            compiler=compiler,
            variant=variant,
            prompt_products=prompt,
        )
    version, core = _openblas_identity(provider)
    if reason is None:
        in_env = user_core(os.environ) is not None
        reason = CoreReason.ENVIRONMENT if in_env else CoreReason.DETECTED
    users = reason is CoreReason.ENVIRONMENT and os.environ.get(CORE_CHOSEN_ENV) != user_core(
        os.environ
    )
    wider = wider_core(core, this_cpus_flags()) if users else None
    decision = CoreDecision(core, reason, wider=wider)
    return BlasStatus(
        "OpenBLAS",
        provider,
        True,
        shim,
        kernels,
        version=version,
        core=decision,
        compiler=compiler,
        variant=variant,
        prompt_products=prompt,
    )


def _shim_build(provider: str) -> tuple[bool, str | None, str | None, bool]:
    """Whether our shim has its kernels, the compiler that built it, the variant it was
    built as (a shim built before it said so says nothing) and whether it takes a prompt's
    products past 32 rows."""
    shim = ctypes.CDLL(provider, mode=os.RTLD_NOLOAD)
    kernels = bool(shim.semantic_blas_small_kernels())
    prompt = hasattr(shim, "semantic_prompt_products") and bool(shim.semantic_prompt_products())
    compiler = _said(shim, "semantic_blas_compiler")
    return kernels, compiler, _said(shim, "semantic_kernel_variant"), prompt


def _said(library: ctypes.CDLL, function: str) -> str | None:
    """The string a ``const char *f(void)`` of ``library`` returns; None if it has none."""
    if not hasattr(library, function):
        return None
    getattr(library, function).restype = ctypes.c_char_p
    named = getattr(library, function)()
    return named.decode(errors="replace") if isinstance(named, bytes) else None


def _openblas_identity(path: str) -> tuple[str | None, str | None]:
    """OpenBLAS's version and the core it loaded, as the library itself reports them."""
    try:
        library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
        library.openblas_get_corename.restype = ctypes.c_char_p
        library.openblas_get_config.restype = ctypes.c_char_p
        config = (library.openblas_get_config() or b"").decode(errors="replace").split()
        core = (library.openblas_get_corename() or b"").decode(errors="replace") or None
    except (OSError, AttributeError):
        return None, None
    version = config[1] if len(config) > 1 and config[0] == "OpenBLAS" else None
    return version, core


class _DlInfo(ctypes.Structure):
    _fields_ = (
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    )


def global_provider(symbol: str) -> str | None:
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
    """Log which BLAS MLX uses; warn when it is the slow reference one, or OpenBLAS on a
    generic core."""
    status = preload_fast_blas()
    if not status.fast:
        log.warning("BLAS: %s; matmuls run about 30x slower. %s", status.name, status.remedy)
    elif status.generic_core:
        log.warning(
            "BLAS: %s; this is OpenBLAS's generic fallback: matmuls run about 3x slower. A "
            "newer OpenBLAS knows this CPU; or set %s to a core the CPU supports",
            status.describe(),
            CORETYPE_ENV,
        )
    elif status.core is not None and status.core.wider:
        where = "their attention scores" if status.prompt_products else "prompts"
        log.warning("BLAS: %s (ADR 0004: %s run on the narrower kernels)", status.describe(), where)
    else:
        log.info("BLAS: %s", status.describe())
    return status


def _load_shim(blas_path: str) -> ctypes.CDLL | None:
    """Build (once) and load the shim ahead of OpenBLAS; None if that is not possible."""
    try:
        library = _build_shim(blas_path)
        if library is None:
            return None
        local = ctypes.CDLL(str(library), mode=ctypes.RTLD_LOCAL)
        if not local.semantic_blas_shim_ready():
            log.warning("sgemm shim could not find cblas_sgemv in %s; not using it", blas_path)
            return None
        return ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL | os.RTLD_NOLOAD)
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("sgemm shim unavailable (%s); decode will be slower", error)
        return None


def _build_shim(blas_path: str) -> Path | None:
    return build_library(SHIM_SOURCE, SHIM_NAME, [f'-DBLAS_TARGET="{blas_path}"'])
