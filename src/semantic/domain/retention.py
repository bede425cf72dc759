"""How long an agent's KV should stay where it is: its retention hints.

``priority`` (0-100) ranks an agent's memory against others' when memory is short;
``ttl_seconds`` keeps its blocks in memory that long after their last use, then moves them
to disk (never deletes them); ``pinned`` keeps them on disk whatever other traffic comes
(only the tenant's own quota may take them). Clients say it on the agents API, in the
``X-Retention`` header of any front door, or as the SDKs do: OpenAI's
``prompt_cache_retention`` and Anthropic's ``cache_control.ttl`` (ADR 0028).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from semantic.domain.errors import InvalidRequestError

DEFAULT_PRIORITY: Final = 50
MAX_TTL_S: Final = 7 * 24 * 3600.0
"""A week: past it a hint is a mistake (milliseconds given as seconds, say), not a plan."""
HEADER: Final = "X-Retention"

OPENAI_RETENTION: Final = {"in_memory": 600.0, "24h": 86_400.0}
"""``prompt_cache_retention``: OpenAI keeps an in-memory prefix 5-10 minutes, an extended
one up to 24 hours; here, that long in memory after its last use."""
ANTHROPIC_TTL: Final = {"5m": 300.0, "1h": 3600.0}
"""``cache_control: {"type": "ephemeral", "ttl": ...}``; no ttl is Anthropic's 5 minutes."""
FIELDS: Final = frozenset({"priority", "ttl_seconds", "pinned"})


@dataclass(frozen=True, slots=True)
class Retention:
    priority: int = DEFAULT_PRIORITY
    ttl_seconds: float | None = None
    """None: in memory until memory is short (the least valuable go first)."""
    pinned: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise _bad("priority", "must be an integer from 0 to 100")
        if not 0 <= self.priority <= 100:
            raise _bad("priority", f"must be from 0 to 100, not {self.priority}")
        ttl = self.ttl_seconds
        if ttl is not None and (
            isinstance(ttl, bool)
            or not isinstance(ttl, int | float)
            or not math.isfinite(ttl)
            or not 0 < ttl <= MAX_TTL_S
        ):
            raise _bad("ttl_seconds", f"must be a number of seconds above 0, at most {MAX_TTL_S:g}")
        if not isinstance(self.pinned, bool):
            raise _bad("pinned", "must be true or false")

    @property
    def is_default(self) -> bool:
        return self == Retention()

    def changed(self, change: Mapping[str, Any]) -> Retention:
        """These hints with the fields ``change`` gives (a request's own) set."""
        unknown = set(change) - FIELDS
        if unknown:
            name = sorted(unknown)[0]
            raise _bad(
                name, f"unknown retention field {name[:40]!r}; use {', '.join(sorted(FIELDS))}"
            )
        return replace(self, **change)

    def as_dict(self) -> dict[str, Any]:
        return {"priority": self.priority, "ttl_seconds": self.ttl_seconds, "pinned": self.pinned}

    def to_json(self) -> str:
        return json.dumps(self.as_dict())

    @classmethod
    def from_json(cls, text: str | None) -> Retention:
        return cls() if not text else cls(**json.loads(text))


def header_change(value: str) -> dict[str, Any]:
    """``X-Retention: priority=80, ttl=300, pinned`` as the fields it sets (``ttl=none``
    clears a TTL, ``pinned=false`` a pin)."""
    change: dict[str, Any] = {}
    for part in (p.strip() for p in value.split(",")):
        if not part:
            continue
        name, _, given = (s.strip() for s in part.partition("="))
        field = _HEADER_FIELDS.get(name)
        if field is None:
            raise _bad(HEADER, f"unknown retention field {name[:40]!r}; use priority, ttl, pinned")
        if field in change:
            raise _bad(HEADER, f"{name} is given twice")
        if field == "pinned":
            change[field] = _flag(given or "true")
        elif field == "priority":
            change[field] = _integer(given, "priority")
        else:
            change[field] = None if given.lower() == "none" else _seconds(given)
    try:
        Retention().changed(change)
    except InvalidRequestError as error:  # out of range: said as the header's
        raise _bad(HEADER, f"{HEADER}: {error}") from None
    return change


_HEADER_FIELDS: Final = {
    "pinned": "pinned",
    "priority": "priority",
    "ttl": "ttl_seconds",
    "ttl_seconds": "ttl_seconds",
}
"""The header's names for the fields (``ttl`` short for ``ttl_seconds``)."""


def openai_change(retention: object) -> dict[str, Any]:
    """``prompt_cache_retention`` as the fields it sets."""
    if retention is None:
        return {}
    if retention not in OPENAI_RETENTION:
        raise _bad("prompt_cache_retention", "must be 'in_memory' or '24h'")
    return {"ttl_seconds": OPENAI_RETENTION[str(retention)]}


def anthropic_change(cache_control: object, param: str) -> dict[str, Any]:
    """One ``cache_control`` block as the fields it sets."""
    if cache_control is None:
        return {}
    if not isinstance(cache_control, dict) or cache_control.get("type") != "ephemeral":
        raise _bad(param, 'cache_control must be {"type": "ephemeral"} with an optional ttl')
    ttl = cache_control.get("ttl", "5m")
    if ttl not in ANTHROPIC_TTL or set(cache_control) - {"type", "ttl"}:
        raise _bad(param, "cache_control.ttl must be '5m' or '1h'")
    return {"ttl_seconds": ANTHROPIC_TTL[ttl]}


def longest(changes: list[dict[str, Any]]) -> dict[str, Any]:
    """Several marks in one request (Anthropic's up to four breakpoints): the longest TTL
    holds, as the marked prefix is what is kept."""
    ttls = [c["ttl_seconds"] for c in changes if c.get("ttl_seconds") is not None]
    return {"ttl_seconds": max(ttls)} if ttls else {}


def _flag(given: str) -> bool:
    if given.lower() in ("true", "1", "yes"):
        return True
    if given.lower() in ("false", "0", "no"):
        return False
    raise _bad(HEADER, f"pinned must be true or false, not {given[:20]!r}")


def _integer(given: str, name: str) -> int:
    try:
        return int(given)
    except ValueError:
        raise _bad(HEADER, f"{name} must be an integer, not {given[:20]!r}") from None


def _seconds(given: str) -> float:
    try:
        return float(given)
    except ValueError:
        raise _bad(HEADER, f"ttl must be a number of seconds, not {given[:20]!r}") from None


def _bad(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"{param}: {message}" if param not in message else message, param=param
    )
