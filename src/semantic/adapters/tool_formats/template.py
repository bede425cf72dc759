"""Tool formats of chat templates that take ``tools`` themselves: the template lists the
tools and writes the history's calls and results; this module only hands them over in
the shape Hugging Face templates read, and says how each family writes a call (Hermes
style for Qwen 2.5/3 and Hermes, ``[TOOL_CALLS]`` for Mistral, bare JSON for Llama 3.1+).
ADR 0018."""

from __future__ import annotations

import hashlib
import json
import re
import string
from collections.abc import Callable, Sequence
from typing import Any

from semantic.adapters.tool_formats.json_calls import JsonCallFormat
from semantic.domain.chat import ChatMessage
from semantic.domain.tools import Tool


class TemplateFormat(JsonCallFormat):
    def __init__(
        self,
        name: str,
        open_tag: str,
        close_tag: str,
        *,
        call_id: Callable[[str], str] = str,
        **shape: Any,
    ) -> None:
        """``call_id``: a call's id as the template takes it (the ids clients see are the
        front door's own; Mistral's template takes nine letters and digits only)."""
        super().__init__(name, open_tag, close_tag, **shape)
        self._call_id = call_id

    def render(
        self, messages: Sequence[ChatMessage], tools: Sequence[Tool]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        out = [_message(m, self._call_id) for m in messages]
        listed = [{"type": "function", "function": _function(t)} for t in tools]
        return out, listed or None


def hermes() -> TemplateFormat:
    """Qwen 2.5/3 and Hermes templates: ``<tool_call>\\n{...}\\n</tool_call>``."""
    return TemplateFormat("hermes", "<tool_call>\n", "\n</tool_call>")


def mistral() -> TemplateFormat:
    return TemplateFormat("mistral", "[TOOL_CALLS][", "]", call_id=nine_characters)


def llama3() -> TemplateFormat:
    """Llama 3.1+ JSON tool calling: the reply is the call object itself, one a reply (its
    template refuses a history of parallel calls)."""
    return TemplateFormat(
        "llama3", "", "", arguments_key="parameters", trigger='{"name"', one_call=True
    )


_NINE = re.compile(r"[A-Za-z0-9]{9}")
_BASE62 = string.digits + string.ascii_letters


def nine_characters(call_id: str) -> str:
    """The id as Mistral's template takes it: nine letters and digits (it raises on any
    other), the same for the same id so a conversation's prompt stays its cached prefix;
    an id of that shape as it is."""
    if _NINE.fullmatch(call_id):
        return call_id
    number = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    digits = []
    for _ in range(9):
        number, digit = divmod(number, 62)
        digits.append(_BASE62[digit])
    return "".join(digits)


def _message(message: ChatMessage, call_id: Callable[[str], str]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call_id(call.id),
                "type": "function",
                "function": {"name": call.name, "arguments": _arguments(call.arguments)},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = call_id(message.tool_call_id)
    return out


def _arguments(text: str) -> Any:
    """A call's arguments as the template takes them: their JSON value, or the text itself
    where it is none (a call cut by a limit, sent back as it was cut)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _function(tool: Tool) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description, "parameters": tool.schema}
