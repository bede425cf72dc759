"""Let MLX's compiled CPU kernels use this machine's instruction set.

``mx.compile`` on a CPU writes C++ for each fused elementwise graph and builds it with a
fixed ``g++ -std=c++17 -O3 -fPIC -shared`` command (found on ``PATH``), for the baseline
x86-64: no FMA, so every ``fmaf`` in MLX's ``exp`` is a call into libm. mlx-lm's SwiGLU is
such a kernel: 14 ms of a 16-sequence decode step, 190 ms of a 4,096-token prefill here.
We put a ``g++`` first on ``PATH`` that adds ``-march=native`` and point MLX's kernel cache
(under the temporary directory) at our own, keyed by CPU, so kernels built for another CPU
or without the flag are never loaded: SwiGLU runs in half the time. ADR 0012.
``SEMANTIC_MLX_JIT_NATIVE=0`` leaves MLX's build alone; so does a compiler that rejects
``-march=native`` (Apple clang before 15 on arm64, say), and macOS, where the model runs
on Metal. Python's own temporary directory stays where it was: ``tempfile`` is asked for it
before ``TMPDIR`` changes, so only MLX (and child processes) see the kernel cache there.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from semantic.adapters.mlx.cpu.native_build import cpu_key, native_cache_dir

JIT_ENV = "SEMANTIC_MLX_JIT_NATIVE"
NAME = "mlx-jit-native"
"""Goes into the model fingerprint: kernels built this way round differently (FMA)."""


@functools.cache
def use_native_jit() -> bool:
    """Call before MLX compiles anything; True if MLX's kernels will be built native."""
    if os.environ.get(JIT_ENV) == "0" or sys.platform == "darwin":
        return False
    root = native_cache_dir() / f"mlx-jit-{cpu_key()}"
    wrapper_dir = root / "bin"
    wrapper = wrapper_dir / "g++"
    path = os.environ.get("PATH", "")
    elsewhere = os.pathsep.join(p for p in path.split(os.pathsep) if Path(p) != wrapper_dir)
    compiler = shutil.which("g++", path=elsewhere)  # a child process inherits our PATH
    if compiler is None or not _takes_march_native(compiler):
        return False
    script = f'#!/bin/sh\nexec "{compiler}" "$@" -march=native\n'
    if not wrapper.exists() or wrapper.read_text() != script:
        wrapper_dir.mkdir(parents=True, exist_ok=True)
        temporary = wrapper.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(script)
        temporary.chmod(0o755)
        os.replace(temporary, wrapper)
    tempfile.gettempdir()  # Python's temporary files stay in the usual place
    os.environ["PATH"] = f"{wrapper_dir}{os.pathsep}{elsewhere}"
    os.environ["TMPDIR"] = str(_kernel_home(root))
    return True


def obstacle() -> str | None:
    """Why MLX's kernels are not built for this CPU; None when they are."""
    if use_native_jit():
        return None
    if os.environ.get(JIT_ENV) == "0":
        return f"{JIT_ENV}=0"
    if sys.platform == "darwin":
        return "macOS: the model runs on Metal"
    if shutil.which("g++") is None:
        return "no g++ on PATH (MLX builds its CPU kernels with g++)"
    return "g++ rejects -march=native: MLX's kernels keep the baseline instruction set"


def _takes_march_native(compiler: str) -> bool:
    try:
        subprocess.run(
            [compiler, "-march=native", "-x", "c++", "-fsyntax-only", "-"],
            input=b"int main() { return 0; }\n",
            capture_output=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def _kernel_home(root: Path) -> Path:
    """MLX keeps its built kernels under the temporary directory: give it ours."""
    home = root / "tmp"
    home.mkdir(parents=True, exist_ok=True)
    return home
