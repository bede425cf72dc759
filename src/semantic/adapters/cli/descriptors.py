"""The process's descriptor limit, and how many connections it leaves room for.

Every connection holds a descriptor; so do the server's own files (the model, the
database, KV block saves). A server that lets connections take every descriptor cannot save
KV (EMFILE) and cannot accept anything (issue 32). The soft limit is raised to the hard
limit at start (many systems start a process at 1,024 of a hard 4,096 or more), and
connections are held to what is left after a reserve for the server's own use.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

log = logging.getLogger(__name__)

RESERVED = 512
"""Descriptors kept from connections: the server's own files and pipes (about 50), KV saves
and SQLite, and the connections asyncio accepts in one wake-up (up to ``ACCEPT_BATCH``,
twice over) before any is counted."""
ACCEPT_BATCH = 100
"""Connections asyncio accepts per wake-up of the listening socket (asyncio's default)."""
UNLIMITED_TARGET = 1 << 20
"""What to ask for where the hard limit is "unlimited" (macOS): the kernel caps it anyway."""


@dataclass(frozen=True, slots=True)
class DescriptorLimit:
    before: int
    now: int

    @property
    def connections_allowed(self) -> int:
        """The most connections the limit allows, the reserve kept."""
        return max(self.now - RESERVED, self.now // 2)


def raise_descriptor_limit() -> DescriptorLimit:
    """Raise RLIMIT_NOFILE's soft limit to its hard limit (logged); never fails the start."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as error:
            log.warning(
                "could not raise the descriptor limit from %d to %d: %s", soft, target, error
            )
        else:
            log.info("descriptor limit (RLIMIT_NOFILE) raised from %d to %d", soft, target)
            return DescriptorLimit(soft, target)
    now = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    now = UNLIMITED_TARGET if now == resource.RLIM_INFINITY else now
    log.info("descriptor limit (RLIMIT_NOFILE): %d", now)
    return DescriptorLimit(soft if soft != resource.RLIM_INFINITY else now, now)
