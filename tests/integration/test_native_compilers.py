"""Our C kernels build with clang as with gcc (issue 36): the same sources, the kernels in
(AVX-512 where the CPU has it), the products right, and the shim names its compiler."""

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
from semantic.adapters.mlx.cpu import attention, host_pass
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
    "why_not": _kernels_here(status), "worst": worst,
    "softmax": attention._kernel_library() is not None, "pass": host_pass._library() is not None,
}))
"""


def _probe(tmp_path: Path, compiler: str) -> tuple[dict[str, Any], str]:
    done = run_python(_PROBE, CC=compiler, SEMANTIC_NATIVE_CACHE=str(tmp_path / "native"))
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
    avx512 = "avx512f" in Path("/proc/cpuinfo").read_text()
    assert found["kernels"] == avx512, found
    assert (found["why_not"] is None) == avx512, found


def test_a_build_without_avx512_runs_right_and_says_why_its_kernels_are_off(
    tmp_path: Path,
) -> None:
    """An AVX2-only x86 build, as on a CPU without AVX-512 (gcc told ``-mno-avx512f``
    after ``-march=native``): the products still come out right (sgemv and OpenBLAS), the
    host softmax's kernel still builds, and the fast paths say why the small kernels and
    the host pass are off."""
    compiler = tmp_path / "gcc-avx2"
    compiler.write_text('#!/bin/sh\nexec gcc "$@" -mno-avx512f\n')
    compiler.chmod(0o755)
    found, _ = _probe(tmp_path, str(compiler))
    assert not found["kernels"], found
    avx512 = "avx512f" in Path("/proc/cpuinfo").read_text()
    said = "built the kernels without it" if avx512 else "no AVX-512 on this CPU"
    assert said in found["why_not"], found
