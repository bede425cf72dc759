"""Whether this instance can take an agent's turn now (``/ready``), apart from whether its
process lives and its model is loaded (``/health``).

A router asks this before it sends an instance anything: an instance whose disk refuses
transcripts, or whose metadata database does not answer, would answer every turn with a
507 or a 503, and the agents hashed to it would fail while others could serve them. Such
an instance says so here, and is taken out of rotation; once the disk has room again or
the database answers, it says so too and is put back (ADR 0029).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from semantic.application.cache.disk_room import DiskState
from semantic.domain.errors import SemanticError
from semantic.ports.probe import Probe

PROBE_TIMEOUT_S = 2.0
"""A store that has not answered in this long counts as unreachable (a router's check
waits about that long)."""


@dataclass(frozen=True, slots=True)
class Readiness:
    reasons: tuple[str, ...] = ()
    """Why turns would fail here now (none: ready)."""

    @property
    def ready(self) -> bool:
        return not self.reasons


class ReadinessCheck:
    """``disk``: the disk keeper's state (a refusal stands while the disk is that full);
    ``probes``: the stores a turn writes to, by name."""

    def __init__(
        self,
        disk: Callable[[], DiskState],
        probes: Mapping[str, Probe],
        timeout_s: float = PROBE_TIMEOUT_S,
    ) -> None:
        self._disk = disk
        self._probes = dict(probes)
        self._timeout_s = timeout_s

    async def check(self) -> Readiness:
        reasons = []
        refused = self._disk().refused
        if refused is not None:
            reasons.append(f"storage: {refused}")
        for name, probe in self._probes.items():
            try:
                await asyncio.wait_for(probe.ping(), self._timeout_s)
            except TimeoutError:
                reasons.append(f"{name}: no answer in {self._timeout_s:g} s")
            except SemanticError as error:
                reasons.append(f"{name}: {error}")
        return Readiness(tuple(reasons))
