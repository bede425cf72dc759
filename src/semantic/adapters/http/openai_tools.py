"""OpenAI's tool shapes to the domain's and back: ``tools``, ``tool_choice``,
``parallel_tool_calls``, assistant ``tool_calls`` and ``tool`` messages in the history,
and the calls of a reply (``message.tool_calls``, and their stream deltas)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from semantic.application.chat.generation import TextDelta
from semantic.application.chat.tool_replies import Call, CallOpened, ReplyEvent
from semantic.domain.errors import InvalidRequestError
from semantic.domain.tools import (
    ToolCall,
    ToolChoice,
    ToolUse,
    checked_tools,
    sent_back,
    tool_use,
)


def openai_tool_use(
    tools: list[dict[str, Any]] | None,
    tool_choice: str | dict[str, Any] | None,
    parallel: bool | None,
) -> ToolUse | None:
    functions = [_function(tool, index) for index, tool in enumerate(tools or [])]
    choice, named = _choice(tool_choice)
    return tool_use(checked_tools(functions), choice, named, parallel is not False)


def _function(tool: object, index: int) -> tuple[object, object, object, object]:
    where = f"tools[{index}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise InvalidRequestError(
            f"{where}: only tools of type 'function' are supported, got {kind!r}", param="tools"
        )
    if set(tool) - {"type", "function"}:
        extra = sorted(set(tool) - {"type", "function"})[0]
        raise InvalidRequestError(f"{where}: a tool has no field {extra!r}", param="tools")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise InvalidRequestError(f"{where}: 'function' must be an object", param="tools")
    unknown = set(function) - {"name", "description", "parameters", "strict"}
    if unknown:
        field = sorted(unknown)[0]
        raise InvalidRequestError(f"{where}: a function has no field {field!r}", param="tools")
    return (
        function.get("name"),
        function.get("description"),
        function.get("parameters"),
        function.get("strict"),
    )


def _choice(choice: str | dict[str, Any] | None) -> tuple[ToolChoice, str | None]:
    if choice is None or choice == "auto":
        return ToolChoice.AUTO, None
    if choice == "none":
        return ToolChoice.NONE, None
    if choice == "required":
        return ToolChoice.REQUIRED, None
    if isinstance(choice, dict) and choice.get("type") == "function":
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str):
            return ToolChoice.NAMED, name
    raise InvalidRequestError(
        "tool_choice must be 'none', 'auto', 'required' or "
        '{"type": "function", "function": {"name": ...}}',
        param="tool_choice",
    )


def history_calls(raw: list[dict[str, Any]]) -> tuple[ToolCall, ...]:
    """An assistant message's ``tool_calls`` as sent back."""
    calls = []
    for index, call in enumerate(raw):
        where = f"an assistant message's tool_calls[{index}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(call, dict) or not isinstance(function, dict):
            raise InvalidRequestError(f"{where} needs a 'function' object", param="messages")
        call_id, name, arguments = call.get("id"), function.get("name"), function.get("arguments")
        if not isinstance(call_id, str) or not call_id or not isinstance(name, str):
            raise InvalidRequestError(f"{where} needs its 'id' and name", param="messages")
        if not isinstance(arguments, str):
            raise InvalidRequestError(f"{where}: arguments must be a string", param="messages")
        calls.append(ToolCall(call_id, name, sent_back(arguments)))
    return tuple(calls)


def call_entry(call: Call) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def reply_delta(event: ReplyEvent) -> dict[str, Any]:
    """A piece of a reply as OpenAI streams it: text as ``content``; a call's id, type and
    name in its first delta (arguments empty), then its arguments in pieces."""
    if isinstance(event, TextDelta):
        return {"content": event.text}
    if isinstance(event, CallOpened):
        opened = {
            "index": event.index,
            "id": event.id,
            "type": "function",
            "function": {"name": event.name, "arguments": ""},
        }
        return {"tool_calls": [opened]}
    return {"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]}


@dataclass(frozen=True, slots=True)
class CallShape:
    """How a chat reply writes its calls: its finish reason when they are whole, the
    message's fields, and each piece streamed (``tool_calls``, or the older API's
    ``function_call``, ``openai_functions``)."""

    finish: str
    message: Callable[[Sequence[Call]], dict[str, Any]]
    delta: Callable[[ReplyEvent], dict[str, Any]]


TOOL_CALLS = CallShape(
    "tool_calls", lambda calls: {"tool_calls": [call_entry(c) for c in calls]}, reply_delta
)
