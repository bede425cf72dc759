"""The domain ring imports nothing but the standard library and itself."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

DOMAIN = Path(__file__).parents[2] / "src" / "semantic" / "domain"


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_domain_imports_only_the_standard_library() -> None:
    allowed = set(sys.stdlib_module_names) | {"__future__", "semantic"}
    offenders = {
        str(path.relative_to(DOMAIN)): sorted(imported_roots(path) - allowed)
        for path in DOMAIN.rglob("*.py")
        if imported_roots(path) - allowed
    }
    assert offenders == {}


def test_domain_imports_no_other_ring() -> None:
    for path in DOMAIN.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("semantic.")
            ):
                assert node.module.startswith("semantic.domain"), f"{path.name}: {node.module}"
