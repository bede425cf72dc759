"""Hard limits per namespace: what one tenant's KV may take of each tier (ADR 0028).

A tenant over its quota gives up its own least valuable blocks, never another tenant's.
A block is charged to the namespace whose chain it is in, once, however many of that
namespace's agents hold it (namespaces never share blocks: ADR 0005).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from semantic.domain.errors import InvalidRequestError

MIB: Final = 1 << 20
TIERS: Final = ("memory_mb", "disk_mb", "shared_mb")
"""Memory, this instance's disk, and the shared tier (what the namespace keeps in Redis)."""


@dataclass(frozen=True, slots=True)
class Quota:
    memory_bytes: int | None = None
    disk_bytes: int | None = None
    shared_bytes: int | None = None


class NamespaceQuotas:
    """The quotas of the namespaces that have one; the others have none."""

    def __init__(self, quotas: Mapping[str, Quota] | None = None) -> None:
        self._quotas = dict(quotas or {})

    def of(self, namespace: str) -> Quota:
        return self._quotas.get(namespace, Quota())

    def limited(self) -> dict[str, Quota]:
        return dict(self._quotas)

    @classmethod
    def parse(cls, text: str, smallest: int) -> NamespaceQuotas:
        """``{"team-a": {"memory_mb": 512, "disk_mb": 4096, "shared_mb": 8192}}``; each limit
        at least ``smallest`` bytes (one block: a quota that cannot hold one is a mistake)."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as error:
            raise InvalidRequestError(f"the quotas are not JSON: {error}") from None
        if not isinstance(raw, dict):
            raise InvalidRequestError("the quotas are a JSON object by namespace")
        return cls.of_mapping(raw, smallest)

    @classmethod
    def of_mapping(cls, raw: Mapping[str, Any], smallest: int) -> NamespaceQuotas:
        """``{"team-a": {"memory_mb": 512}}`` already read (from JSON or a keys file)."""
        return cls({str(ns): _quota(str(ns), given, smallest) for ns, given in raw.items()})

    def with_others(self, others: NamespaceQuotas) -> NamespaceQuotas:
        """Both sets; a namespace given a quota in each must be given the same one."""
        for namespace, quota in others.limited().items():
            if self._quotas.get(namespace, quota) != quota:
                raise InvalidRequestError(
                    f"namespace {namespace!r} is given two different quotas (the quotas file "
                    "and the keys file)",
                    param=namespace,
                )
        return NamespaceQuotas({**self._quotas, **others.limited()})


def _quota(namespace: str, given: Any, smallest: int) -> Quota:
    if not isinstance(given, dict) or not given or set(given) - set(TIERS):
        raise InvalidRequestError(
            f"the quota of {namespace!r} takes {', '.join(TIERS)} (MiB)", param=namespace
        )
    limits: dict[str, int | None] = {}
    for tier in TIERS:
        value = given.get(tier)
        name = f"{namespace}.{tier}"
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise InvalidRequestError(f"{name} must be a number of MiB", param=name)
        if value is not None and value * MIB < smallest:
            raise InvalidRequestError(
                f"{name} is {value} MiB, less than one block ({smallest / MIB:.1f} MiB)",
                param=name,
            )
        limits[tier] = None if value is None else int(value * MIB)
    return Quota(limits["memory_mb"], limits["disk_mb"], limits["shared_mb"])
