"""Tool formats of chat templates that take ``tools`` themselves: the template lists the
tools and writes the history's calls and results; this module only hands them over in
the shape Hugging Face templates read, and says how each family writes a call (Hermes
style for Qwen 2.5/3 and Hermes, ``[TOOL_CALLS]`` for Mistral, bare JSON for Llama 3.1+).
ADR 0018."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from semantic.adapters.tool_formats.json_calls import JsonCallFormat
from semantic.domain.chat import ChatMessage
from semantic.domain.tools import Tool


class TemplateFormat(JsonCallFormat):
    def render(
        self, messages: Sequence[ChatMessage], tools: Sequence[Tool]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        out = [_message(m) for m in messages]
        listed = [{"type": "function", "function": _function(t)} for t in tools]
        return out, listed or None


def hermes() -> TemplateFormat:
    """Qwen 2.5/3 and Hermes templates: ``<tool_call>\\n{...}\\n</tool_call>``."""
    return TemplateFormat("hermes", "<tool_call>\n", "\n</tool_call>")


def mistral() -> TemplateFormat:
    return TemplateFormat("mistral", "[TOOL_CALLS][", "]")


def llama3() -> TemplateFormat:
    """Llama 3.1+ JSON tool calling: the reply is the call object itself."""
    return TemplateFormat("llama3", "", "", arguments_key="parameters", trigger='{"name"')


def _message(message: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": _arguments(call.arguments)},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
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
