"""Check a data directory offline: every block row points at a file that verifies."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import xxhash


def block_problems(data_dir: Path) -> list[str]:
    """Rows whose file is missing or does not match its checksum (quarantined rows excluded)."""
    problems = []
    with sqlite3.connect(data_dir / "semantic.db") as db:
        rows = db.execute("SELECT key, checksum FROM blocks WHERE tier != 'quarantined'").fetchall()
        referenced = {k for (k,) in db.execute("SELECT DISTINCT block_key FROM agent_blocks")}
    known = {key for key, _ in rows}
    for key, checksum in rows:
        path = data_dir / "blocks" / key[:2] / f"{key}.safetensors"
        if not path.exists():
            problems.append(f"{key[:16]}: file missing")
        elif xxhash.xxh3_128_hexdigest(path.read_bytes()) != checksum:
            problems.append(f"{key[:16]}: checksum mismatch")
    problems += [f"{key[:16]}: referenced by an agent, no row" for key in referenced - known]
    return problems
