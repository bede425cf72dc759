"""Edits that keep a conversation within the model's window: dropping its oldest turns
(OpenAI Responses' ``truncation: "auto"``) and clearing old tool results (Anthropic's
``clear_tool_uses_20250919``). Pure: which messages change and how; how many tokens that
saves is measured by whoever renders the prompt.

Both edit the *oldest* part of a history and leave the newest as it was, and both give the
same edited history when asked again with more turns appended, so the turn after an edit
starts from the cached KV of the edited prompt (ADR 0020).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from semantic.domain.chat import ChatMessage
from semantic.domain.errors import InvalidRequestError

CLEARED_RESULT = "[tool result cleared to save context]"
CLEARED_INPUT = "{}"


class Message(Protocol):
    @property
    def role(self) -> str: ...


M = TypeVar("M", bound=Message)


def turn_starts(messages: Sequence[Message]) -> list[int]:
    """Where each turn begins: at a user message (a tool's result stays in the turn of the
    call it answers)."""
    return [index for index, message in enumerate(messages) if message.role == "user"]


def without_oldest_turns(messages: Sequence[M], turns: int) -> list[M]:
    """``messages`` less their first ``turns`` turns (system messages are kept)."""
    starts = turn_starts(messages)
    if turns <= 0 or not starts:
        return list(messages)
    cut = starts[turns] if turns < len(starts) else len(messages)
    return [m for i, m in enumerate(messages) if i >= cut or m.role == "system"]


@dataclass(frozen=True, slots=True)
class ClearToolUses:
    """Anthropic's ``clear_tool_uses_20250919`` edit, its defaults as documented: at
    100,000 input tokens, keep the last 3 tool uses, clear the results of the older ones."""

    trigger_tokens: int | None = 100_000
    trigger_uses: int | None = None
    """The edit applies from this many tool uses on (instead of ``trigger_tokens``)."""
    keep: int = 3
    clear_at_least: int = 0
    """Tokens an application must save, else the history is left as it was."""
    exclude: frozenset[str] = frozenset()
    clear_inputs: bool | frozenset[str] = False
    """Also clear the calls' arguments: of every tool, or of the tools named."""

    def __post_init__(self) -> None:
        for name in ("trigger_tokens", "trigger_uses"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InvalidRequestError(f"{name} must be at least 1", param="context_management")
        if self.keep < 0 or self.clear_at_least < 0:
            raise InvalidRequestError(
                "keep and clear_at_least must not be negative", param="context_management"
            )

    def triggered(self, prompt_tokens: int, messages: Sequence[ChatMessage]) -> bool:
        if self.trigger_uses is not None:
            return len(_uses(messages)) >= self.trigger_uses
        return self.trigger_tokens is not None and prompt_tokens >= self.trigger_tokens

    def clearing_inputs_of(self, tool: str) -> bool:
        inputs = self.clear_inputs
        return inputs if isinstance(inputs, bool) else tool in inputs


def clear_tool_uses(
    messages: Sequence[ChatMessage], edit: ClearToolUses
) -> tuple[list[ChatMessage], int]:
    """``messages`` with the tool uses before the last ``edit.keep`` cleared (their
    results, and their arguments where asked), and how many uses that was. Uses of an
    excluded tool are never cleared and do not count towards ``keep``."""
    uses = [u for u in _uses(messages) if u[1] not in edit.exclude]
    cleared = {call_id for call_id, _ in uses[: max(0, len(uses) - edit.keep)]}
    out = [_cleared(message, cleared, edit) for message in messages]
    return out, len(cleared)


def _uses(messages: Sequence[ChatMessage]) -> list[tuple[str, str]]:
    """Every call in the history, oldest first: its id and tool."""
    return [(c.id, c.name) for m in messages for c in m.tool_calls]


def _cleared(message: ChatMessage, cleared: set[str], edit: ClearToolUses) -> ChatMessage:
    if message.role == "tool" and message.tool_call_id in cleared:
        return dataclasses.replace(message, content=CLEARED_RESULT)
    calls = tuple(
        dataclasses.replace(c, arguments=CLEARED_INPUT)
        if c.id in cleared and edit.clearing_inputs_of(c.name)
        else c
        for c in message.tool_calls
    )
    return (
        dataclasses.replace(message, tool_calls=calls) if calls != message.tool_calls else message
    )
