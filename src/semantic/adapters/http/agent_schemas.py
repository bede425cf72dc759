"""Bodies of the stateful agents API."""

from __future__ import annotations

from typing import Any

import msgspec

from semantic.adapters.http.errors import in_own_words
from semantic.domain.errors import InvalidRequestError
from semantic.domain.retention import Retention


class ContextRule(msgspec.Struct, forbid_unknown_fields=True):
    """An agent's context policy: ``drop_oldest_turns`` or ``clear_tool_results`` once its
    prompt reaches ``trigger_tokens`` (``keep``: the tool results left, when clearing)."""

    edit: str
    trigger_tokens: int
    keep: int = 3


class RetentionIn(msgspec.Struct, forbid_unknown_fields=True):
    """The fields given change; the others keep their value (the defaults, on create)."""

    priority: int | msgspec.UnsetType = msgspec.UNSET
    ttl_seconds: float | msgspec.UnsetType | None = msgspec.UNSET
    pinned: bool | msgspec.UnsetType = msgspec.UNSET

    def change(self) -> dict[str, Any]:
        """The fields given, each checked and named as the body names it when refused
        (``retention.priority``), as a type error there is."""
        given = {f: getattr(self, f) for f in self.__struct_fields__}
        change = {name: value for name, value in given.items() if value is not msgspec.UNSET}
        try:
            Retention().changed(change)
        except InvalidRequestError as error:
            field = error.param or "retention"
            raise in_own_words(error, field, f"retention.{field}", f"retention.{field}") from None
        return change


class CreateAgent(msgspec.Struct, forbid_unknown_fields=True):
    id: str
    system_prompt: str | None = None
    namespace: str | None = None
    context: ContextRule | None = None
    retention: RetentionIn | None = None


class PatchAgent(msgspec.Struct, forbid_unknown_fields=True):
    retention: RetentionIn


class ForkAgent(msgspec.Struct, forbid_unknown_fields=True):
    id: str


class SendMessage(msgspec.Struct, forbid_unknown_fields=True):
    content: str
    role: str = "user"
    """``tool`` for a tool's result, with the ``tool_call_id`` it answers."""
    tool_call_id: str | None = None
    tools: list[dict[str, Any]] | None = None
    """OpenAI-shaped, as ``tool_choice`` and ``parallel_tool_calls``: what the reply may call."""
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    stream: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
