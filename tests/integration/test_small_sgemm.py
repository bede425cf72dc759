"""Our cblas_sgemm in front of OpenBLAS (native/small_sgemm.c), through MLX's real matmul."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from semantic.adapters.mlx.cpu.blas import PIN_ENV, blas_in_use
from tests.helpers import run_python

import mlx.core as mx  # isort: skip
import numpy as np  # isort: skip

ROWS = (1, 3, 4, 5, 8, 16, 17, 32, 33)
SHAPES = ((1, 1), (7, 15), (130, 64), (1536, 576), (64, 1000))  # (columns, depth)


def _machine_has_fma_vectors() -> bool:
    """AVX2 + FMA or wider on x86, or arm64 (NEON): every variant with the kernels."""
    cpuinfo = Path("/proc/cpuinfo")
    if not (sys.platform.startswith("linux") and cpuinfo.exists()):
        return False
    text = cpuinfo.read_text()
    return ("avx2" in text and "fma" in text) or "asimd" in text


def _random(*shape: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _close(got: mx.array, want: np.ndarray, depth: int) -> None:
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5 * depth**0.5)


def test_the_kernels_are_in_use_wherever_they_can_be_built() -> None:
    status = blas_in_use()
    if not (status.shim and _machine_has_fma_vectors()):
        pytest.skip(f"no AVX2 + FMA or NEON, or no shim on this machine ({status})")
    assert status.small_kernels


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("columns", "depth"), SHAPES)
def test_activation_times_transposed_weights_matches_numpy(
    rows: int, columns: int, depth: int
) -> None:
    x, weights = _random(rows, depth, seed=rows), _random(columns, depth, seed=columns)
    _close(mx.array(x) @ mx.array(weights).T, x.astype(np.float64) @ weights.T, depth)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("columns", "depth"), SHAPES)
def test_activation_times_plain_matrix_matches_numpy(rows: int, columns: int, depth: int) -> None:
    x, values = _random(rows, depth, seed=rows), _random(depth, columns, seed=columns)
    _close(mx.array(x) @ mx.array(values), x.astype(np.float64) @ values, depth)


@pytest.mark.parametrize("transposed", [True, False])
def test_alpha_and_beta_are_applied(transposed: bool) -> None:
    x, other, bias = _random(5, 70, seed=1), _random(130, 70, seed=2), _random(5, 130, seed=3)
    b = mx.array(other).T if transposed else mx.array(np.ascontiguousarray(other.T))
    got = mx.addmm(mx.array(bias), mx.array(x), b, alpha=0.5, beta=2.0)
    _close(got, 0.5 * (x.astype(np.float64) @ other.T) + 2.0 * bias, 70)


def test_strided_batches_of_small_products_match_numpy() -> None:
    """Decode attention: per (sequence, head) a few query rows against a slice of a cache."""
    queries, cache = _random(4, 3, 3, 64, seed=4), _random(4, 3, 300, 64, seed=5)
    keys = mx.array(cache)[:, :, :200]
    want = queries.astype(np.float64) @ cache[:, :, :200].swapaxes(-1, -2)
    _close(mx.array(queries) @ keys.swapaxes(-1, -2), want, 64)


@pytest.mark.parametrize(
    ("rows", "columns", "depth"), [(16, 1536, 576), (32, 130, 1000), (16, 70, 577)]
)
def test_a_row_gets_the_same_bits_alone_and_in_a_batch(rows: int, columns: int, depth: int) -> None:
    """Whole blocks of 16 rows take the lane tiles on AVX2 (lane_tiles.h), other counts the
    dot tiles, one row its own: every one sums each output alike. Columns not a multiple of
    the tiles' and depths past the last 16 included."""
    if not blas_in_use().small_kernels:
        pytest.skip("the small-product kernels are not built on this machine")
    batch = mx.array(_random(rows, depth, seed=6))
    weights = mx.array(_random(columns, depth, seed=7))
    together = np.asarray(batch @ weights.T)
    for row in (0, 5, rows - 1):
        alone = np.asarray(batch[row : row + 1] @ weights.T)
        assert np.array_equal(alone[0], together[row])
    assert np.array_equal(np.asarray(batch[:15] @ weights.T), together[:15])


def test_a_prompts_products_on_our_kernels_give_each_row_its_bits_alone() -> None:
    """``SEMANTIC_PROMPT_PRODUCTS=ours`` (what a narrower OpenBLAS core than our variant
    chooses by itself): past 32 rows x @ W^T runs on the dot tiles, so a chunk's row is the
    bits it gets alone and matches the exact product; attention's depth stays OpenBLAS's."""
    if not blas_in_use().small_kernels:
        pytest.skip("the small-product kernels are not built on this machine")
    code = """
import json
import os
os.environ["SEMANTIC_PROMPT_PRODUCTS"] = "ours"
from semantic.adapters.mlx.cpu import prepare_process
from semantic.adapters.mlx.cpu.blas import blas_in_use
prepare_process()
import mlx.core as mx
import numpy as np
rng = np.random.default_rng(0)
x, w = rng.standard_normal((70, 577), np.float32), rng.standard_normal((130, 577), np.float32)
together = np.array(mx.array(x) @ mx.array(w).T)
alone = [np.array(mx.array(x[r : r + 1]) @ mx.array(w).T)[0] for r in (0, 33, 69)]
exact = x.astype(np.float64) @ w.T.astype(np.float64)
print(json.dumps({"said": blas_in_use().describe(),
                  "same": all(np.array_equal(a, together[r]) for a, r in zip(alone, (0, 33, 69))),
                  "error": float(np.abs(together - exact).max())}))
"""
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert "a prompt's x @ W^T past them" in seen["said"]
    assert seen["same"]
    assert seen["error"] < 1e-3


def _threads() -> dict[str, set[int]]:
    """Each thread's name (with its id, to tell the unnamed apart) and allowed CPUs."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        name = (task / "comm").read_text().strip()
        out[f"{name}/{task.name}"] = os.sched_getaffinity(int(task.name))
    return out


def test_blas_helper_threads_leave_the_first_cpu_to_the_caller() -> None:
    """OpenBLAS's worker and our helper only help the thread that calls sgemm: they share
    the last CPU, and the first stays free for the caller (and anything else)."""
    cpus = sorted(os.sched_getaffinity(0))
    status = blas_in_use()
    if len(cpus) < 2 or not (status.shim and status.small_kernels):
        pytest.skip(f"needs 2+ CPUs and our kernels ({len(cpus)} CPUs, {status})")
    if os.environ.get(PIN_ENV) == "0":
        pytest.skip(f"{PIN_ENV}=0 leaves placement to the scheduler")
    _product(rows=8)  # the helper starts on first use
    threads = _threads()
    helpers = [cpus_ for name, cpus_ in threads.items() if name.startswith("sgemm-helper/")]
    assert len(helpers) == 1
    assert len(helpers[0]) == 1
    assert helpers[0] <= set(cpus[1:])
    main = f"{Path('/proc/self/comm').read_text().strip()}/{os.getpid()}"
    assert threads[main] == set(cpus)


def test_a_process_allowed_one_cpu_starts_no_helper_and_says_why_steps_run_one_at_a_time() -> None:
    """A helper on the caller's only CPU would take turns with it (slower, not faster)."""
    if not (blas_in_use().shim and blas_in_use().small_kernels):
        pytest.skip("needs our kernels")
    code = """
import json
import os
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
from semantic.adapters.mlx.cpu import prepare_process
prepare_process()
import mlx.core as mx
import numpy as np
from semantic.adapters.mlx.cpu.accelerations import _beside_obstacle
rng = np.random.default_rng(0)
a, b = rng.standard_normal((8, 576), np.float32), rng.standard_normal((1536, 576), np.float32)
product = a @ b.T
mine = np.array(mx.array(a) @ mx.array(b).T)
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print(json.dumps({"threads": names, "error": float(np.abs(mine - product).max()),
                  "beside": _beside_obstacle(None)}))
"""
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert "sgemm-helper" not in seen["threads"]
    assert seen["error"] < 1e-3
    assert seen["beside"] == "one CPU allowed to this process"


def _product(rows: int) -> None:
    """One product big enough for the kernel to share it with its helper thread."""
    a = mx.array(_random(rows, 576, seed=1))
    b = mx.array(_random(1536, 576, seed=2))
    mx.eval(a @ b.T)


def test_importing_mlx_first_is_named_as_the_cause_of_a_slow_blas() -> None:
    """The fast BLAS can only go in front of MLX before ``mlx.core`` loads; a process that
    imported it first is told to change its import order, not to install OpenBLAS."""
    code = (
        "import mlx.core\n"
        "from semantic.adapters.mlx.cpu.blas import report_blas\n"
        "print(report_blas().fast)\n"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    if done.stdout.strip() == "True":
        pytest.skip("MLX found a fast BLAS on its own here")
    assert "prepare_process() before importing mlx.core" in done.stderr
    assert "Install OpenBLAS" not in done.stderr
