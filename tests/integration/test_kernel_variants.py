"""Every kernel variant this CPU can run (issue 44), each in a process of its own (the
kernels are loaded once, before MLX): the AVX2 variant on an AVX-512 machine gives the same
bits as the widest, so a cache written on one CPU class continues exactly on another; and
the conformance matrix's exact rows pass on the narrower variant too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from semantic.adapters.mlx.cpu.blas import PROMPT_PRODUCTS_ENV
from semantic.adapters.mlx.cpu.kernel_variant import (
    VARIANT_ENV,
    this_cpus_variants,
    this_process_variant,
)
from tests.helpers import run_python
from tests.integration.conftest import RealModel

_ROOT = Path(__file__).resolve().parents[2]

_PROBE = """
import hashlib, json
from pathlib import Path
from semantic.adapters.mlx.cpu import prepare_process
prepare_process()
import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache
from semantic.adapters.mlx.accelerator import Group
from semantic.adapters.mlx.cpu.blas import blas_in_use
from semantic.adapters.mlx.cpu.host_pass import HostPass
from semantic.adapters.mlx.models.loader import load_model
rng = np.random.default_rng(0)
digest = hashlib.sha256()
for rows in (1, 4, 17, 32):  # every tile shape, and a depth with a scalar tail
    x = mx.array(rng.standard_normal((rows, 577)).astype(np.float32))
    w = mx.array(rng.standard_normal((301, 577)).astype(np.float32))
    digest.update(np.asarray(x @ w.T).tobytes())
    digest.update(np.asarray(x[:, :301] @ w[:, :301]).tobytes())
model = load_model(Path(%(model)r), 'probe').model
host = HostPass.of(model)
caches = [KVCache() for _ in model.model.layers]
model.model(mx.array([[int(t) for t in rng.integers(100, 40_000, 300)]]), cache=caches)
for step in (mx.array([[int(t) for t in rng.integers(100, 40_000, 20)]]), mx.array([[42]])):
    hidden = host.hidden([Group(step, caches)])
    digest.update(np.asarray(hidden[0]).tobytes())
status = blas_in_use()
print(json.dumps({"variant": status.variant, "kernels": status.small_kernels,
                  "digest": digest.hexdigest()}))
"""


def _fma_variants() -> list[str]:
    return [v for v in this_cpus_variants() if v != "baseline"]


def _run(variant: str, model: Path) -> dict[str, Any]:
    """The probe on ``variant``, the prompt's products on our kernels whatever OpenBLAS's
    core (left to itself, each variant chooses by its own width against the core's: ADR
    0004), so that the digest covers them too."""
    env = {VARIANT_ENV: variant, PROMPT_PRODUCTS_ENV: "ours"}
    done = run_python(_PROBE % {"model": str(model)}, **env)
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["variant"] == variant, found
    assert found["kernels"], found
    return found


@pytest.mark.model
def test_every_variant_here_gives_the_same_bits(real_model: RealModel) -> None:
    """Products of every tile shape and the host pass over the real model (its attention,
    norms, RoPE and SwiGLU), on each variant: the same digest."""
    variants = _fma_variants()
    if len(variants) < 2:
        pytest.skip(f"only {variants or 'the baseline'} runs on this CPU")
    digests = {variant: _run(variant, real_model.path)["digest"] for variant in variants}
    assert len(set(digests.values())) == 1, digests


@pytest.mark.model
def test_the_conformance_matrix_exact_rows_pass_on_the_avx2_variant() -> None:
    """The matrix's exact rows for the llama-bodied float32 rows (where every fast path runs)
    with ``SEMANTIC_CPU_VARIANT=avx2``: warm == cold, batched == alone, restored == cold."""
    if "avx2" not in _fma_variants() or this_process_variant().name == "avx2":
        pytest.skip("no AVX2 variant here, or this run is already on it")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/conformance/test_matrix.py",
            "-k",
            "f32w-float32 and (llama- or qwen3-)",
        ],
        cwd=_ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, VARIANT_ENV: "avx2"},
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:]
    assert " passed" in done.stdout, done.stdout[-2000:]
    assert " failed" not in done.stdout, done.stdout[-2000:]
