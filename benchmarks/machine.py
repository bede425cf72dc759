"""The machine a figure came from, printed first by every benchmark.

A figure is only true for the machine it came from: the same commit ran a cold 4K prompt in
8.5 s on one VM of this kind and 28.8 s on another, whose OpenBLAS did not know the CPU and
ran its oldest kernels (issue 31). So every output starts with the CPU, the flags its
kernels depend on, the variant our kernels run as, the BLAS and its core, and the library versions.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import httpx

from semantic.adapters.mlx.cpu.blas import preload_fast_blas
from semantic.adapters.mlx.cpu.blas_core import cpu_flags
from semantic.adapters.mlx.cpu.kernel_variant import (
    VARIANT_ENV,
    this_cpus_variants,
    this_process_variant,
)

FLAGS_THAT_MATTER = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_bf16",
    "avx512_vnni",
    "amx_tile",
    "asimd",
    "sve",
)
"""The instruction sets the BLAS cores and our kernels choose between."""


def machine() -> dict[str, str]:
    """What the next figures depend on, as short strings (also stored in results.json)."""
    cpuinfo = _cpuinfo()
    flags = cpu_flags(cpuinfo)
    return {
        "cpu": _cpu_model(cpuinfo),
        "flags": " ".join(f for f in FLAGS_THAT_MATTER if f in flags) or "-",
        "cores": str(
            len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        ),
        "blas": preload_fast_blas().describe(),
        "kernels": _kernel_variant(),
        "mlx": _version("mlx"),
        "mlx-lm": _version("mlx-lm"),
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()} {platform.machine()}",
    }


def machine_line(found: dict[str, str] | None = None) -> str:
    found = found or machine()
    return (
        f"machine: {found['cpu']}, {found['cores']} cores, flags {found['flags']}; "
        f"kernels {found.get('kernels', '?')}; BLAS {found['blas']}; "
        f"mlx {found['mlx']}, mlx-lm {found['mlx-lm']}, "
        f"Python {found['python']}, {found['os']}"
    )


def print_machine() -> dict[str, str]:
    found = machine()
    print(machine_line(found), flush=True)
    return found


def print_fast_paths(url: str) -> None:
    """What the server under measurement says it runs (``runtime.accelerations`` of
    ``GET /v1/models/{id}``): the paths that are off, each with its reason."""
    model_id = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    runtime = httpx.get(f"{url}/v1/models/{model_id}", timeout=10).json()["runtime"]
    found: dict[str, str] = runtime["accelerations"]
    off = [f"{name}: {said}" for name, said in found.items() if said != "on"]
    print(f"server fast paths: {len(found) - len(off)} of {len(found)} on", flush=True)
    for line in off:
        print(f"  {line}", flush=True)


def _kernel_variant() -> str:
    """The variant our kernels run as, and why (the widest here, or asked for by name)."""
    running = preload_fast_blas().variant or this_process_variant().name
    widest = this_cpus_variants()[0]
    if running == widest:
        return f"{running} (the widest here)"
    return f"{running} (asked for by {VARIANT_ENV}; the widest here is {widest})"


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _cpu_model(cpuinfo: str) -> str:
    """The CPU's name, with its x86 family and model: a VM's name is often just "AMD
    EPYC", and family 25 covers Zen 3 (model 1, AVX2 only) and Zen 4 (model 17, AVX-512)."""
    fields = _first_fields(cpuinfo)
    name = next(
        (fields[key] for key in ("model name", "Model", "cpu model") if fields.get(key)),
        platform.processor() or sys.platform,
    )
    if "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name


def _first_fields(cpuinfo: str) -> dict[str, str]:
    """Each key's first value in /proc/cpuinfo (the first CPU's)."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"
