"""Importing semantic changes nothing in the process: no environment variable, no library
in the global symbol scope, nothing compiled. The command line asks for that work in one
explicit step (``prepare_process``).

The third-party packages are imported first: mlx-lm's own ``__init__`` sets
``TRANSFORMERS_NO_ADVISORY_WARNINGS``, which is mlx-lm's doing, whoever imports it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import run_python

CHILD = """
import ctypes, importlib, json, os, pkgutil, sys
import mlx.core, mlx.nn, mlx_lm, numpy, safetensors, sqlalchemy, litestar, uvicorn
before = dict(os.environ)
import semantic
names = [m.name for m in pkgutil.walk_packages(semantic.__path__, "semantic.")]
for name in names:
    importlib.import_module(name)
after = dict(os.environ)
changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
try:
    ctypes.CDLL(None).cblas_sgemm
    global_blas = True
except AttributeError:
    global_blas = False
print(json.dumps({"modules": len(names), "changed": changed, "global_blas": global_blas}))
"""


def test_importing_every_module_changes_nothing_in_the_process(tmp_path: Path) -> None:
    native = tmp_path / "native"
    done = run_python(CHILD, SEMANTIC_NATIVE_CACHE=str(native))
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["modules"] > 50
    assert found["changed"] == []
    assert not found["global_blas"]
    assert not native.exists() or not any(native.iterdir())  # nothing was compiled


def test_the_cpu_accelerators_facade_loads_no_mlx() -> None:
    """``prepare_process`` comes from the facade and must run before ``mlx.core`` loads
    (MLX binds to the BLAS in the global symbol scope then): importing it loads no MLX."""
    code = (
        "import sys\n"
        "from semantic.adapters.mlx.cpu import prepare_process\n"
        "print(sorted(m for m in ('mlx.core', 'mlx_lm', 'numpy') if m in sys.modules))\n"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
