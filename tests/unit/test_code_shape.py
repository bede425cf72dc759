"""The code's shape, held where a reader would first be lost: narrow ports, rooms that say
what they hold, modules and functions one can read whole, and front doors that reach the
model only through a use case."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).parents[2] / "src" / "semantic"
MAX_PORT_MEMBERS = 10
MAX_LOOSE_MODULES = 8
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 50


def modules(root: Path = SRC) -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(root.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def protocol_members(node: ast.ClassDef) -> list[str]:
    members = []
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            members.append(item.name)
        elif isinstance(item, ast.AnnAssign):
            members.append(ast.unparse(item.target))
    return members


def is_protocol(node: ast.ClassDef) -> bool:
    return any(ast.unparse(base).split(".")[-1].startswith("Protocol") for base in node.bases)


def test_every_protocol_is_narrow() -> None:
    wide = {
        f"{path.relative_to(SRC)}:{node.name}": len(protocol_members(node))
        for path, tree in modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and is_protocol(node)
        if len(protocol_members(node)) > MAX_PORT_MEMBERS
    }
    assert wide == {}


def test_the_application_ring_keeps_its_modules_in_rooms() -> None:
    loose = [p.name for p in (SRC / "application").glob("*.py") if p.name != "__init__.py"]
    assert len(loose) <= MAX_LOOSE_MODULES, loose


def test_modules_and_functions_read_whole() -> None:
    long_modules = {
        str(path.relative_to(SRC)): lines
        for path, _ in modules()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    long_functions = {
        f"{path.relative_to(SRC)}:{node.name}": lines
        for path, tree in modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        if (lines := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_FUNCTION_LINES
    }
    assert (long_modules, long_functions) == ({}, {})


def test_front_doors_reach_the_model_only_through_a_use_case() -> None:
    """No HTTP module names the tokenizer, the generation service or the engine: a route
    that rendered or queued a prompt itself would be a second chat turn."""
    forbidden = {
        "semantic.ports.tokenizer",
        "semantic.application.engine.engine_loop",
        "semantic.application.engine.batch_engine",
    }
    names = {"Tokenizer", "tokenizer", "GenerationService", "EngineLoop", "render_chat"}
    found: dict[str, set[str]] = {}
    for path, tree in modules(SRC / "adapters" / "http"):
        used = {
            node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module in forbidden
        }
        used |= {
            node.attr if isinstance(node, ast.Attribute) else node.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute | ast.Name)
            and (node.attr if isinstance(node, ast.Attribute) else node.id) in names
        }
        if used:
            found[str(path.relative_to(SRC))] = used
    assert found == {}
