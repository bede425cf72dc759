"""Compile our C kernels (``native/*.c``) once per machine, for its CPU, into a cache dir.

Built with ``-O3`` and the flags of this process's kernel variant (``kernel_variant``:
``-march=native``, narrowed where a narrower variant is asked for; without
``-march=native`` if the compiler does not know it) and keyed by source, compiler, build
options and CPU identity, so a home directory shared between machines never loads code built for
another CPU.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from semantic.adapters.mlx.cpu.kernel_variant import this_process_variant

log = logging.getLogger(__name__)

NATIVE_DIR = Path(__file__).parent / "native"


def native_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("SEMANTIC_NATIVE_CACHE", Path(base) / "semantic" / "native"))


def build_library(source: Path, name: str, options: Sequence[str] = ()) -> Path | None:
    """The shared library built from ``source``; None if there is no C compiler."""
    variant = this_process_variant()
    flags = [*options, *variant.flags]
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        log.info("no C compiler found; running without %s", source.name)
        return None
    text = source.read_bytes() + b"".join(h.read_bytes() for h in sorted(NATIVE_DIR.glob("*.h")))
    built_by = "\0".join([compiler, *flags]).encode()
    key = hashlib.sha256(text + built_by + _cpu_identity()).hexdigest()[:16]
    target = native_cache_dir() / f"{name}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        command = [compiler, "-O3", "-shared", "-fPIC", "-o", str(built), str(source)]
        command += ["-ldl", "-lpthread", "-lm"]
        compile_ = functools.partial(subprocess.run, check=True, capture_output=True, timeout=120)
        try:
            compile_([*command, *flags])
        except subprocess.CalledProcessError as error:  # not every compiler knows the flag
            log.warning(
                "%s rejected %s with -march=native (%s); built for the baseline instruction"
                " set instead, without this CPU's vector units",
                compiler,
                source.name,
                _first_error(error.stderr),
            )
            compile_([*command, *options, *variant.portable_flags])
        os.replace(built, target)
    return target


def _first_error(stderr: bytes | None) -> str:
    lines = (stderr or b"").decode(errors="replace").splitlines()
    errors = [line.strip() for line in lines if "error" in line.lower()]
    return (errors or [line.strip() for line in lines if line.strip()] or ["no message"])[0]


def cpu_key() -> str:
    """A short name for this CPU model and its instruction set."""
    return hashlib.sha256(_cpu_identity()).hexdigest()[:12]


def _cpu_identity() -> bytes:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return b""
    wanted = ("model name", "flags", "Features", "CPU part")
    return "\n".join(sorted({ln for ln in lines if ln.startswith(wanted)})).encode()
