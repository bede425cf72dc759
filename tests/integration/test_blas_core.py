"""The process's OpenBLAS runs on kernels for this CPU, never silently on a generic core."""

from __future__ import annotations

import os

import pytest

from semantic.adapters.mlx.cpu.blas import blas_in_use
from semantic.adapters.mlx.cpu.blas_core import CORETYPE_ENV
from semantic.adapters.mlx.cpu.blas_probe import probe
from tests.helpers import run_python


def _openblas() -> str:
    status = blas_in_use()
    if status.name != "OpenBLAS" or status.path is None or status.core is None:
        pytest.skip(f"MLX does not run on OpenBLAS here ({status.name})")
    return status.path


def test_this_process_runs_openblas_on_a_core_that_is_not_a_generic_fallback() -> None:
    _openblas()
    core = blas_in_use().core
    assert core is not None
    assert core.core is not None
    assert not core.generic, f"OpenBLAS runs on {core.describe()}"


def test_the_probe_reports_the_core_and_checks_the_products() -> None:
    found = probe(_openblas(), os.environ.get(CORETYPE_ENV))
    assert found is not None
    assert found.right
    assert found.config.startswith("OpenBLAS ")
    assert found.core.lower() == (blas_in_use().core.core or "").lower()  # type: ignore[union-attr]  # _openblas() checked it


def test_the_startup_line_names_library_version_core_and_reason() -> None:
    """What ``semantic serve`` logs: the same process preparation, in a fresh process."""
    _openblas()
    code = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(message)s')\n"
        "from semantic.adapters.mlx.cpu import prepare_process\n"
        "from semantic.adapters.mlx.cpu.blas import report_blas\n"
        "prepare_process()\n"
        "report_blas()\n"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("BLAS: "))
    assert "OpenBLAS 0." in line
    assert "core " in line
    assert any(reason in line for reason in ("detected", "chosen", "set by OPENBLAS_CORETYPE"))
