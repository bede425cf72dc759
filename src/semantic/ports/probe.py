"""A store's answer to "are you there?", for readiness."""

from __future__ import annotations

from typing import Protocol


class Probe(Protocol):
    async def ping(self) -> None:
        """Return once the store has answered a trivial request; raise
        ``StorageUnavailableError`` where it cannot be reached."""
        ...
