"""Which build of our C kernels this process runs: the widest the CPU has, or a narrower one
asked for by name (``SEMANTIC_CPU_VARIANT``), so every variant is measured and tested on
whatever machine one has (ADR 0026).

Every variant is built from the same sources (``native/simd.h``): AVX-512 (x86-64 with
AVX-512F and FMA), AVX2 + FMA, NEON (arm64), and the baseline (no fused multiply-add: the
small-product kernels stay off there). A variant is a set of compiler flags; the kernels
themselves report which one they were built as, and that is what the server says it runs.
"""

from __future__ import annotations

import logging
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass

from semantic.adapters.mlx.cpu.blas_probe import this_cpus_flags

log = logging.getLogger(__name__)

VARIANT_ENV = "SEMANTIC_CPU_VARIANT"
"""``auto`` (the default: the widest this CPU has), ``avx512``, ``avx2``, ``neon`` or
``baseline``."""

VARIANTS = ("avx512", "avx2", "neon", "baseline")
"""Every variant, widest first."""

_NATIVE = "-march=native"
_FORCE_BASELINE = "-DSIMD_FORCE_BASELINE"


@dataclass(frozen=True, slots=True)
class KernelVariant:
    name: str
    flags: tuple[str, ...]
    """Compiler flags for this CPU: ``-march=native`` first, then what narrows it."""
    asked: bool
    """Named in ``SEMANTIC_CPU_VARIANT`` rather than chosen as the widest."""

    @property
    def portable_flags(self) -> tuple[str, ...]:
        """The flags without ``-march=native``, for a compiler that rejects it."""
        return tuple(flag for flag in self.flags if flag != _NATIVE)


def variants_here(machine: str, flags: frozenset[str]) -> tuple[str, ...]:
    """The variants this CPU can run, widest first (``machine`` as ``platform.machine()``
    says it, ``flags`` as /proc/cpuinfo lists them)."""
    arch = machine.lower()
    if arch in ("x86_64", "amd64"):
        found = []
        if {"avx512f", "avx2", "fma"} <= flags:
            found.append("avx512")
        if {"avx2", "fma"} <= flags:
            found.append("avx2")
        return (*found, "baseline")
    if arch in ("aarch64", "arm64"):
        return ("neon", "baseline")
    return ("baseline",)


def variant_flags(name: str, flags: frozenset[str]) -> tuple[str, ...]:
    """The flags that build ``name`` on this CPU: the CPU's own set, narrowed."""
    if name == "baseline":
        return (_NATIVE, _FORCE_BASELINE)
    if name == "avx2" and "avx512f" in flags:
        return (_NATIVE, "-mno-avx512f")
    return (_NATIVE,)


def choose_variant(
    environ: Mapping[str, str], machine: str, flags: frozenset[str]
) -> KernelVariant:
    """The widest variant here, or the one ``SEMANTIC_CPU_VARIANT`` names if this CPU can
    run it (a wider one than the CPU has is refused with a warning, never built)."""
    here = variants_here(machine, flags)
    asked = environ.get(VARIANT_ENV, "").strip().lower()
    if asked in ("", "auto"):
        return KernelVariant(here[0], variant_flags(here[0], flags), asked=False)
    if asked not in here:
        known = "one of auto, " + ", ".join(VARIANTS)
        why = f"this CPU runs {', '.join(here)}" if asked in VARIANTS else f"expected {known}"
        log.warning("%s=%s ignored (%s); running %s", VARIANT_ENV, asked, why, here[0])
        return KernelVariant(here[0], variant_flags(here[0], flags), asked=False)
    return KernelVariant(asked, variant_flags(asked, flags), asked=True)


def this_process_variant() -> KernelVariant:
    return choose_variant(os.environ, platform.machine(), this_cpus_flags())


def this_cpus_variants() -> tuple[str, ...]:
    """The variants this machine's CPU can run, widest first."""
    return variants_here(platform.machine(), this_cpus_flags())
