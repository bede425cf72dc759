"""Chat messages as the domain sees them: a role and its text, and for tool use the calls
an assistant made or the call a tool message answers."""

from __future__ import annotations

from dataclasses import dataclass

from semantic.domain.errors import InvalidRequestError
from semantic.domain.tools import ToolCall

ROLES = frozenset({"system", "user", "assistant", "tool"})


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    """An assistant's calls (its ``content`` is the text before them)."""
    tool_call_id: str | None = None
    """A tool message: the call it answers."""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise InvalidRequestError(
                f"message role must be one of {sorted(ROLES)}, got {self.role!r}",
                param="messages",
            )


def check_tool_answers(messages: list[ChatMessage] | tuple[ChatMessage, ...]) -> None:
    """Every tool message answers a call an earlier assistant message made."""
    called: set[str] = set()
    for message in messages:
        called.update(call.id for call in message.tool_calls)
        if message.role == "tool" and message.tool_call_id not in called:
            raise InvalidRequestError(
                f"the tool result for {message.tool_call_id!r} answers no call made earlier "
                "in the conversation (OpenAI's tool_call_id, Anthropic's tool_use_id)",
                param="messages",
            )
