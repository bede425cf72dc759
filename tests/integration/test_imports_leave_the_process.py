"""Importing any module of the package leaves the process as it was: ``os.environ`` (which
mlx-lm's own import writes to) and the descriptor limit (which it would lower)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import semantic

EVERY_MODULE = """
import importlib, json, os, pkgutil, resource, semantic
before = (dict(os.environ), resource.getrlimit(resource.RLIMIT_NOFILE))
changed, count = [], 0
for found in pkgutil.walk_packages(semantic.__path__, "semantic."):
    importlib.import_module(found.name)
    count += 1
    now = (dict(os.environ), resource.getrlimit(resource.RLIMIT_NOFILE))
    if now != before:
        changed.append(found.name)
        before = now
print(json.dumps({"changed": changed, "imported": count}))
"""


def test_importing_every_module_changes_neither_environ_nor_descriptor_limit() -> None:
    done = subprocess.run(
        [sys.executable, "-c", EVERY_MODULE],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())},  # no variable mlx-lm sets
    )
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["changed"] == []
    assert said["imported"] > 150


def test_only_the_guarded_module_imports_mlx_lm() -> None:
    """Every other module takes mlx-lm's names from ``adapters/mlx/lm.py``, whose import
    undoes what mlx-lm's does: a direct import elsewhere could come first."""
    root = Path(semantic.__file__).parent
    direct = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            if any(n == "mlx_lm" or n.startswith("mlx_lm.") for n in names):
                direct.append(path.relative_to(root).as_posix())
    assert sorted(set(direct)) == ["adapters/mlx/lm.py"]
