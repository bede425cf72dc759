"""Our C kernels build with clang as with gcc (issue 36), and as every variant this CPU can
run (issue 44): the same sources, the kernels in wherever there is fused multiply-add, the
products right, and the shim names its compiler and variant."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_python

_PROBE = """
import json
from semantic.adapters.mlx.cpu import prepare_process
prepared = prepare_process()
import numpy as np
import mlx.core as mx
from semantic.adapters.mlx.cpu import attention, llama_native
from semantic.adapters.mlx.cpu.accelerations import _kernels_here
from semantic.adapters.mlx.cpu.blas import blas_in_use
status = blas_in_use()
rng = np.random.default_rng(0)
worst = 0.0
for rows in (1, 4, 17, 32):
    x, w = rng.standard_normal((rows, 576)), rng.standard_normal((300, 576))
    got = np.asarray(mx.array(x.astype(np.float32)) @ mx.array(w.astype(np.float32)).T)
    worst = max(worst, float(np.abs(got - x @ w.T).max()))
print(json.dumps({
    "shim": status.shim, "kernels": status.small_kernels, "compiler": status.compiler,
    "variant": status.variant,
    "why_not": _kernels_here(status), "worst": worst,
    "softmax": attention._kernel_library() is not None,
    "pass": llama_native.native_library() is not None,
}))
"""


def _probe(tmp_path: Path, compiler: str, variant: str = "auto") -> tuple[dict[str, Any], str]:
    done = run_python(
        _PROBE,
        CC=compiler,
        SEMANTIC_NATIVE_CACHE=str(tmp_path / "native"),
        SEMANTIC_CPU_VARIANT=variant,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if not found["shim"]:
        pytest.skip(f"no OpenBLAS shim here: {found['why_not']}")
    assert found["softmax"], found  # the host softmax's kernel builds everywhere
    assert found["pass"] == found["kernels"], found  # the host pass needs the small kernels
    assert found["worst"] < 1e-2, found
    return found, done.stderr


@pytest.mark.skipif(
    shutil.which("clang") is None, reason="no clang here (scripts/setup.sh installs it)"
)
def test_clang_builds_every_kernel_and_the_shim_has_its_kernels_where_the_cpu_allows(
    tmp_path: Path,
) -> None:
    found, log = _probe(tmp_path, "clang")
    assert "rejected" not in log, log  # -march=native taken
    assert found["compiler"].startswith("clang"), found
    fma = {"avx2", "fma"} <= _flags()
    assert found["kernels"] == fma, found
    assert (found["why_not"] is None) == fma, found


def _flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def _needs(*flags: str) -> None:
    if not set(flags) <= _flags():
        pytest.skip(f"this CPU lacks {', '.join(sorted(set(flags) - _flags()))}")


def test_the_avx2_variant_runs_its_kernels_on_a_wider_cpu(tmp_path: Path) -> None:
    """``SEMANTIC_CPU_VARIANT=avx2`` on an AVX-512 machine: the kernels built without
    AVX-512, in use, the products right, and the shim says which variant it is."""
    _needs("avx2", "fma")
    found, _ = _probe(tmp_path, "gcc", variant="avx2")
    assert found["kernels"], found
    assert found["variant"] == "avx2", found
    assert found["why_not"] is None, found


def test_the_baseline_asked_for_by_name_runs_right_and_says_why_its_kernels_are_off(
    tmp_path: Path,
) -> None:
    """The variant without fused multiply-add (x86 before AVX2): the products still come
    out right (sgemv and OpenBLAS), the host softmax's kernel still builds, and the fast
    paths say why the small kernels and the host pass are off."""
    found, _ = _probe(tmp_path, "gcc", variant="baseline")
    assert not found["kernels"], found
    assert found["variant"] == "baseline", found
    assert "SEMANTIC_CPU_VARIANT=baseline" in found["why_not"], found


def test_a_compiler_that_leaves_out_fma_is_named(tmp_path: Path) -> None:
    """gcc told ``-mno-fma`` after our flags, as a compiler that does not know this CPU:
    the kernels are off and the reason names the compiler, not the CPU."""
    _needs("avx2", "fma")
    compiler = tmp_path / "gcc-no-fma"
    compiler.write_text('#!/bin/sh\nexec gcc "$@" -mno-fma -mno-avx512f\n')
    compiler.chmod(0o755)
    found, _ = _probe(tmp_path, str(compiler))
    assert not found["kernels"], found
    assert "built the kernels without fused multiply-add" in found["why_not"], found
