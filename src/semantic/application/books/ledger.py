"""One request's claim on the block pool, as ``KVBooks`` keeps it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class BlockLedger:
    """The pool blocks a request holds for the positions its cache holds, layer by layer,
    under ``owner``. A record only: ``KVBooks`` claims, binds and gives back its blocks,
    so what the pool holds and what a request believes it holds change together."""

    owner: str
    n_layers: int
    ids: list[list[int]] = field(default_factory=list)
    positions: int = 0

    def __post_init__(self) -> None:
        if not self.ids:
            self.ids = [[] for _ in range(self.n_layers)]

    @property
    def block_count(self) -> int:
        return sum(map(len, self.ids))

    def clear(self) -> list[int]:
        """Forget every block; returns the ids it held."""
        held = [b for ids in self.ids for b in ids]
        self.ids = [[] for _ in range(self.n_layers)]
        self.positions = 0
        return held
