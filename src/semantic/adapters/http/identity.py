"""Who a request is for: agent id, namespace and priority, from headers or the path.

Ids become file and database keys, so they are checked at the edge before any work: ASCII
letters, digits, ``.``, ``_`` and ``-``, starting with a letter or digit, at most 128
characters, and never ``..``.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any

from litestar import Request

from semantic.domain.errors import InvalidRequestError, SemanticError
from semantic.domain.generation import Priority

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
DEFAULT_NAMESPACE = "default"
NAMESPACE_HEADER = "X-Namespace"
BOUND_NAMESPACE = "semantic.bound_namespace"
"""Where the edge leaves, in the request's ``state``, the namespace its API key is bound to."""


class NamespaceNotAllowedError(SemanticError):
    """The request's API key is bound to another namespace than the one it names."""

    def __init__(self, bound: str, named: str) -> None:
        super().__init__(
            f"this API key is bound to the namespace {bound!r} and may not use {_shown(named)}"
        )


class AdminKeyNeededError(SemanticError):
    """What every namespace shares (the metrics) asked for with a key bound to one."""

    def __init__(self, what: str, bound: str) -> None:
        super().__init__(
            f"{what} covers every namespace; this API key is bound to {bound!r}: use an admin key"
        )


@dataclass(frozen=True, slots=True)
class Identity:
    namespace: str
    agent_id: str | None
    priority: Priority


def checked_id(value: str, what: str) -> str:
    if not _ID.fullmatch(value) or ".." in value:
        raise InvalidRequestError(
            f"invalid {what} {_shown(value)}: use 1-128 ASCII letters, digits, '.', '_' or '-', "
            "starting with a letter or digit, without '..'",
            param=what,
        )
    return value


def _shown(value: str) -> str:
    """The refused id as its sender wrote it, cut short: a header arrives decoded as
    Latin-1, so UTF-8 sent there is decoded again."""
    with contextlib.suppress(UnicodeError):
        value = value.encode("latin-1").decode("utf-8")
    return repr(value[:64]) + (f" ({len(value)} characters)" if len(value) > 64 else "")


def identity(request: Request[Any, Any, Any]) -> Identity:
    namespace = _one_header(request, NAMESPACE_HEADER)
    agent = _one_header(request, "X-Agent-Id")
    priority = _one_header(request, "X-Priority")
    return Identity(
        checked_id(DEFAULT_NAMESPACE if namespace is None else namespace, "namespace"),
        checked_id(agent, "agent_id") if agent is not None else None,
        Priority.parse(priority) if priority is not None else Priority.NORMAL,
    )


def bound_namespace(request: Request[Any, Any, Any]) -> str | None:
    """The namespace the request's key is bound to; None for an admin key or none."""
    bound = (request.scope.get("state") or {}).get(BOUND_NAMESPACE)
    return bound if isinstance(bound, str) else None


def require_admin(request: Request[Any, Any, Any], what: str) -> None:
    bound = bound_namespace(request)
    if bound is not None:
        raise AdminKeyNeededError(what, bound)


def _one_header(request: Request[Any, Any, Any], name: str) -> str | None:
    """A header given at most once: two namespaces or agents in one request are a mistake
    to report, not a choice to make for the client (a namespace isolates tenants)."""
    values = request.headers.getall(name, [])
    if len(values) > 1:
        raise InvalidRequestError(f"the {name} header is given {len(values)} times", param=name)
    return values[0] if values else None
