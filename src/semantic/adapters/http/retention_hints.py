"""A request's retention hints, as each front door's clients send them (ADR 0028).

``X-Retention`` on any route that names an agent; OpenAI's ``prompt_cache_retention``
(and ``prompt_cache_key``, which names the agent when ``X-Agent-Id`` does not); Anthropic's
``cache_control`` on the request, its system blocks, messages and tools. They set the
hints of the request's agent, kept on its record; a request without an agent has nothing
to keep them on, and they are only checked.
"""

from __future__ import annotations

import hashlib
from typing import Any

from litestar import Request

from semantic.adapters.http.identity import checked_id
from semantic.adapters.http.state import Services
from semantic.domain.errors import InvalidRequestError
from semantic.domain.retention import (
    HEADER,
    Retention,
    anthropic_change,
    header_change,
    longest,
    openai_change,
)

Change = dict[str, Any]


def header_hints(request: Request[Any, Any, Any]) -> Change:
    values = request.headers.getall(HEADER, [])
    if len(values) > 1:
        raise InvalidRequestError(f"give the {HEADER} header once", param=HEADER)
    return header_change(values[0]) if values else {}


def openai_hints(request: Request[Any, Any, Any], retention: object) -> Change:
    """``prompt_cache_retention``, then the header's fields over it."""
    return _checked({**openai_change(retention), **header_hints(request)})


def anthropic_hints(request: Request[Any, Any, Any], data: Any) -> Change:
    """Every ``cache_control`` mark (the longest TTL holds), then the header's fields."""
    marks = [anthropic_change(data.cache_control, "cache_control")]
    if isinstance(data.system, list):
        marks += [anthropic_change(b.cache_control, "system") for b in data.system]
    for message in data.messages:
        if isinstance(message.content, list):
            marks += [anthropic_change(b.cache_control, "messages") for b in message.content]
    for tool in data.tools or ():
        marks.append(anthropic_change(tool.get("cache_control"), "tools"))
    return _checked({**longest(marks), **header_hints(request)})


def cache_key_agent(key: str | None) -> str | None:
    """The agent ``prompt_cache_key`` names: the key itself where it is a valid agent id,
    else one made of its hash (the same key, the same agent)."""
    if key is None:
        return None
    try:
        return checked_id(key, "prompt_cache_key")
    except InvalidRequestError:
        return "pck-" + hashlib.sha256(key.encode()).hexdigest()[:40]


async def keep_hints(
    found: Services, namespace: str, agent_id: str | None, change: Change, *, known: bool = False
) -> None:
    """The agent's hints with ``change`` set (checked before: this does not refuse)."""
    if change and agent_id is not None:
        await found.agents.retain(namespace, agent_id, change, known=known)


def _checked(change: Change) -> Change:
    """Refused now, before the request starts, if the values are out of range."""
    Retention().changed(change)
    return change
