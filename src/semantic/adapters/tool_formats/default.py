"""The default tool format, for chat templates that take no ``tools`` (the embedded
SmolLM2's ChatML): the tools are listed in the system turn, a call is written
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, and a tool's result comes
back as a user turn ``<tool_response>...</tool_response>``. Everything is plain text in
the template's own roles, so any template renders it. ADR 0018."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from semantic.adapters.tool_formats.json_calls import JsonCallFormat
from semantic.domain.chat import ChatMessage
from semantic.domain.tools import Tool

TOOLS_INTRO = (
    "You can call functions to help with the user's request. The functions, one JSON "
    "object per line:\n<tools>\n{tools}\n</tools>\n"
    "To call a function, answer with a JSON object of its name and arguments between tags, "
    'one call per pair of tags: <tool_call>{{"name": "<function name>", "arguments": '
    "{{<arguments>}}}}</tool_call>\nA function's result comes back between "
    "<tool_response></tool_response> tags."
)


class DefaultFormat(JsonCallFormat):
    def __init__(self) -> None:
        super().__init__("default", "<tool_call>", "</tool_call>")

    def render(
        self, messages: Sequence[ChatMessage], tools: Sequence[Tool]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """The messages as plain system/user/assistant turns; no ``tools`` for the template."""
        out: list[dict[str, Any]] = []
        for message in messages:
            if message.role == "tool":
                answer = f"<tool_response>\n{message.content}\n</tool_response>"
                if out and out[-1].get("answers"):  # results of one round share a turn
                    out[-1]["content"] += "\n" + answer
                else:
                    out.append({"role": "user", "content": answer, "answers": True})
            elif message.tool_calls:
                calls = [self.call_text(c.name, c.arguments) for c in message.tool_calls]
                text = "\n".join([message.content, *calls] if message.content else calls)
                out.append({"role": "assistant", "content": text})
            else:
                out.append({"role": message.role, "content": message.content})
        for turn in out:
            turn.pop("answers", None)
        if tools:
            _list_tools(out, tools)
        return out, None


def _list_tools(turns: list[dict[str, Any]], tools: Sequence[Tool]) -> None:
    listed = TOOLS_INTRO.format(tools="\n".join(json.dumps(_function(t)) for t in tools))
    if turns and turns[0]["role"] == "system":
        turns[0]["content"] = f"{turns[0]['content']}\n\n{listed}"
    else:
        turns.insert(0, {"role": "system", "content": listed})


def _function(tool: Tool) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description, "parameters": tool.schema}
