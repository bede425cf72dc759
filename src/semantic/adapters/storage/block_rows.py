"""The blocks table, copied in memory, so a restore's lookup does not wait on SQLite.

Every restore first asks which of the prompt's block keys are stored, and which stored
block continues the last one. Through SQLAlchemy's async engine and aiosqlite each such query
costs ~1.2 ms on an idle machine and 4-12 ms while the block readers keep both cores busy,
against microseconds for a dict; the table is small beside the KV it describes (1 KB of
token ids per block, whose file holds ~12 MB). ``SqlMetadataStore`` keeps this copy:
loaded when it opens, changed by the same methods that change the table, under one lock, so
lookups always see a committed state. Rows about to leave the table leave the copy first
(a lookup never finds a block whose file is being deleted); rows a transaction adds or
changes enter it once that transaction has committed.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from semantic.ports.metadata_store import BlockRecord


@dataclass(frozen=True, slots=True)
class BlockRow:
    """A blocks-table row as stored: token ids stay packed until a lookup wants them."""

    key: str
    parent_key: str
    namespace: str
    packed_tokens: bytes
    nbytes: int
    checksum: str
    ref_count: int
    quarantined: bool

    def record(self) -> BlockRecord:
        tokens = array("I")
        tokens.frombytes(self.packed_tokens)
        return BlockRecord(
            self.key,
            self.parent_key,
            self.namespace,
            tuple(tokens),
            self.nbytes,
            self.checksum,
            self.ref_count,
            self.quarantined,
        )


class BlockRows:
    def __init__(self) -> None:
        self._rows: dict[str, BlockRow] = {}
        self._children: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, keys: Iterable[str]) -> dict[str, BlockRecord]:
        return {key: row.record() for key in keys if (row := self._rows.get(key)) is not None}

    def children(self, parent_key: str) -> list[BlockRecord]:
        return [self._rows[key].record() for key in sorted(self._children.get(parent_key, ()))]

    def put(self, rows: Iterable[BlockRow]) -> None:
        for row in rows:
            self._rows[row.key] = row
            self._children.setdefault(row.parent_key, set()).add(row.key)

    def rows(self, keys: Iterable[str]) -> list[BlockRow]:
        return [row for key in keys if (row := self._rows.get(key)) is not None]

    def drop(self, keys: Sequence[str]) -> None:
        for key in keys:
            row = self._rows.pop(key, None)
            if row is None:
                continue
            siblings = self._children.get(row.parent_key)
            if siblings is not None:
                siblings.discard(key)
                if not siblings:
                    del self._children[row.parent_key]

    def quarantine(self, key: str) -> None:
        row = self._rows.get(key)
        if row is not None:
            self._rows[key] = replace(row, quarantined=True)
