"""OpenAI's older function calling, before ``tools``: ``functions`` and ``function_call`` in
the request, ``role: "function"`` results and assistant ``function_call`` messages in the
history, and a reply's one call as ``message.function_call`` (finish ``function_call``).
Clients written for it (LangChain's ``bind_functions``, older agent loops) run unchanged;
underneath it is the tools path with one call a reply, as the older API allowed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from semantic.adapters.http.openai_schemas import ChatMessageIn
from semantic.adapters.http.openai_tools import CallShape
from semantic.application.chat.generation import TextDelta
from semantic.application.chat.tool_replies import Call, CallOpened, ReplyEvent
from semantic.domain.chat import ChatMessage
from semantic.domain.errors import InvalidRequestError
from semantic.domain.tools import (
    ToolCall,
    ToolChoice,
    ToolUse,
    checked_tools,
    sent_back,
    tool_use,
)

_FUNCTION_FIELDS = frozenset({"name", "description", "parameters"})


def function_use(functions: list[dict[str, Any]], function_call: object) -> ToolUse | None:
    """``functions`` and ``function_call`` as the tools path takes them: one call a reply."""
    specs = [_spec(function, index) for index, function in enumerate(functions)]
    choice, named = _choice(function_call)
    tools = checked_tools(specs, "functions")
    return tool_use(tools, choice, named, False, choice_field="function_call")


def _spec(function: object, index: int) -> tuple[object, object, object, object]:
    where = f"functions[{index}]"
    if not isinstance(function, dict):
        raise InvalidRequestError(f"{where} must be an object", param="functions")
    unknown = set(function) - _FUNCTION_FIELDS
    if unknown:
        field = sorted(unknown)[0]
        raise InvalidRequestError(f"{where}: a function has no field {field!r}", param="functions")
    return function.get("name"), function.get("description"), function.get("parameters"), None


def _choice(function_call: object) -> tuple[ToolChoice, str | None]:
    if function_call is None or function_call == "auto":
        return ToolChoice.AUTO, None
    if function_call == "none":
        return ToolChoice.NONE, None
    if isinstance(function_call, dict) and set(function_call) == {"name"}:
        name = function_call["name"]
        if isinstance(name, str):
            return ToolChoice.NAMED, name
    raise InvalidRequestError(
        "function_call must be 'none', 'auto' or {\"name\": ...}", param="function_call"
    )


class FunctionHistory:
    """Reads a history's function calls and results as tool calls and results: a call
    gets an id by its place (the older API has none), and a ``function`` message answers
    the latest call of its name."""

    def __init__(self) -> None:
        self._latest: dict[str, str] = {}

    def call(self, message: ChatMessageIn, place: int) -> tuple[ToolCall, ...]:
        """An assistant message's ``function_call`` as its one call (none without one)."""
        given = message.function_call
        if given is None:
            return ()
        name, arguments = given.get("name"), given.get("arguments")
        if not isinstance(name, str) or not name:
            raise InvalidRequestError(
                "an assistant message's function_call needs its name", param="messages"
            )
        if not isinstance(arguments, str):
            raise InvalidRequestError(
                "an assistant message's function_call.arguments must be a string",
                param="messages",
            )
        call_id = f"call_fn_{place}"
        self._latest[name] = call_id
        return (ToolCall(call_id, name, sent_back(arguments)),)

    def result(self, message: ChatMessageIn, text: str) -> ChatMessage:
        """A ``function`` message: the result of the latest call of its ``name``."""
        name = message.name
        if name is None or name not in self._latest:
            raise InvalidRequestError(
                f"a function message answers a function_call made earlier, by its name; "
                f"none was made of {name!r}",
                param="messages",
            )
        return ChatMessage("tool", text, tool_call_id=self._latest[name])


def _message(calls: Sequence[Call]) -> dict[str, Any]:
    first = calls[0]
    return {"function_call": {"name": first.name, "arguments": first.arguments}}


def _delta(event: ReplyEvent) -> dict[str, Any]:
    if isinstance(event, TextDelta):
        return {"content": event.text}
    if isinstance(event, CallOpened):
        return {"function_call": {"name": event.name, "arguments": ""}}
    return {"function_call": {"arguments": event.text}}


FUNCTION_CALL = CallShape("function_call", _message, _delta)
"""A reply's call as the older API writes it, whole and streamed."""
