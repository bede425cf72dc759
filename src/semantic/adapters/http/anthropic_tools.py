"""Anthropic's tool shapes to the domain's and back: ``tools`` (``input_schema``),
``tool_choice`` (with ``disable_parallel_tool_use``), ``tool_use`` and ``tool_result``
blocks in the history, and a reply's calls as ``tool_use`` blocks."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

import jiter

from semantic.application.chat.tool_replies import Call
from semantic.domain.chat import ChatMessage
from semantic.domain.errors import InvalidRequestError
from semantic.domain.tools import ToolCall, ToolChoice, ToolUse, checked_tools, tool_use

_TOOL_FIELDS = frozenset(
    {
        "name",
        "description",
        "input_schema",
        "type",
        "cache_control",
        "strict",
        "eager_input_streaming",  # how input streams: ours streams as it is generated
        "input_examples",
        "defer_loading",
        "allowed_callers",
    }
)
_CHOICES = {
    "auto": ToolChoice.AUTO,
    "any": ToolChoice.REQUIRED,
    "tool": ToolChoice.NAMED,
    "none": ToolChoice.NONE,
}


def new_tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def anthropic_tool_use(
    tools: list[dict[str, Any]] | None, choice: dict[str, Any] | None
) -> ToolUse | None:
    specs = [_tool(tool, index) for index, tool in enumerate(tools or [])]
    kind = (choice or {}).get("type", "auto")
    if kind not in _CHOICES:
        raise InvalidRequestError(
            f"tool_choice type must be one of {sorted(_CHOICES)}, got {kind!r}",
            param="tool_choice",
        )
    unknown = set(choice or {}) - {"type", "name", "disable_parallel_tool_use"}
    if unknown:
        field = sorted(unknown)[0]
        raise InvalidRequestError(f"tool_choice has no field {field!r}", param="tool_choice")
    named = (choice or {}).get("name")
    if kind == "tool" and not isinstance(named, str):
        raise InvalidRequestError("tool_choice of type 'tool' needs a name", param="tool_choice")
    serial = (choice or {}).get("disable_parallel_tool_use")
    if serial is not None and not isinstance(serial, bool):
        raise InvalidRequestError(
            "tool_choice.disable_parallel_tool_use must be true or false", param="tool_choice"
        )
    return tool_use(checked_tools(specs), _CHOICES[kind], named, not serial)


def _tool(tool: object, index: int) -> tuple[object, object, object, object]:
    where = f"tools[{index}]"
    if not isinstance(tool, dict):
        raise InvalidRequestError(f"{where} must be an object", param="tools")
    if tool.get("type", "custom") != "custom":
        raise InvalidRequestError(
            f"{where}: server tools ({tool.get('type')!r}) are not supported; only custom "
            "tools with an input_schema",
            param="tools",
        )
    unknown = set(tool) - _TOOL_FIELDS
    if unknown:
        raise InvalidRequestError(
            f"{where}: a tool has no field {sorted(unknown)[0]!r}", param="tools"
        )
    if "input_schema" not in tool:
        raise InvalidRequestError(f"{where} needs its input_schema", param="tools")
    _check_direct(tool, where)
    description = _with_examples(tool.get("description"), tool.get("input_examples"), where)
    return tool.get("name"), description, tool["input_schema"], tool.get("strict")


def _check_direct(tool: dict[str, Any], where: str) -> None:
    """A tool the model calls itself: tool search (``defer_loading``) and code execution
    (``allowed_callers`` without ``direct``) are Anthropic's server tools, not served."""
    if tool.get("defer_loading") not in (None, False):
        raise InvalidRequestError(
            f"{where}: defer_loading needs Anthropic's tool search, which this server does "
            "not have; send the tool without it",
            param="tools",
        )
    callers = tool.get("allowed_callers")
    if callers is not None and (not isinstance(callers, list) or "direct" not in callers):
        raise InvalidRequestError(
            f"{where}: allowed_callers must include 'direct' (this server has no code "
            "execution tool to call it)",
            param="tools",
        )


def _with_examples(description: object, examples: object, where: str) -> object:
    """The description the model reads, with the tool's ``input_examples`` after it: the
    model sees them beside the schema, where a chat template has room for nothing else."""
    if examples is None:
        return description
    if not isinstance(examples, list) or not all(isinstance(e, dict) for e in examples):
        raise InvalidRequestError(
            f"{where}: input_examples must be a list of objects", param="tools"
        )
    if not examples or not (description is None or isinstance(description, str)):
        return description  # a bad description is refused with its own words
    shown = "\n".join(json.dumps(example, ensure_ascii=False) for example in examples)
    return f"{description or ''}\n\nExample inputs:\n{shown}".lstrip()


def history_message(role: str, blocks: Sequence[Any]) -> list[ChatMessage]:
    """A message's blocks, where some are ``tool_use`` (an assistant's) or ``tool_result``
    (a user's): the results first, as tool messages, then the user's own text."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    results: list[ChatMessage] = []
    for block in blocks:
        if block.type == "text":
            texts.append(block.text or "")
        elif block.type == "tool_use" and role == "assistant":
            calls.append(_call(block))
        elif block.type == "tool_result" and role == "user":
            results.append(_result(block))
        else:
            raise InvalidRequestError(
                f"content block type {block.type!r} is not supported in a {role} message",
                param="messages",
            )
    text = "".join(texts)
    if role == "assistant":
        return [ChatMessage("assistant", text, tool_calls=tuple(calls))]
    return results + ([ChatMessage("user", text)] if text or not results else [])


def _call(block: Any) -> ToolCall:
    if not isinstance(block.id, str) or not isinstance(block.name, str):
        raise InvalidRequestError("a tool_use block needs its id and name", param="messages")
    if not isinstance(block.input, dict):
        raise InvalidRequestError("a tool_use block's input must be an object", param="messages")
    return ToolCall(block.id, block.name, json.dumps(block.input, ensure_ascii=False))


def _result(block: Any) -> ChatMessage:
    if not isinstance(block.tool_use_id, str):
        raise InvalidRequestError("a tool_result block needs its tool_use_id", param="messages")
    content = block.content
    if isinstance(content, list):
        if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
            raise InvalidRequestError(
                "a tool_result's content blocks must be text blocks", param="messages"
            )
        content = "".join(str(p.get("text", "")) for p in content)
    if content is not None and not isinstance(content, str):
        raise InvalidRequestError(
            "a tool_result's content must be a string or text blocks", param="messages"
        )
    if block.is_error is not None and not isinstance(block.is_error, bool):
        raise InvalidRequestError(
            "a tool_result's is_error must be true or false", param="messages"
        )
    text = content or ""
    if block.is_error:
        text = f"Error: {text}"
    return ChatMessage("tool", text, tool_call_id=block.tool_use_id)


def tool_use_block(call: Call) -> dict[str, Any]:
    """A call cut short by ``max_tokens`` has its input as far as it came, read as the
    SDK's own stream accumulator reads the partial JSON it streamed (jiter's partial mode:
    an unfinished string or number is left out), so the message equals its stream."""
    return {
        "type": "tool_use",
        "id": call.id,
        "name": call.name,
        "input": json.loads(call.arguments) if call.complete else _partial(call.arguments),
    }


def _partial(arguments: str) -> dict[str, Any]:
    try:
        value = jiter.from_json(arguments.encode(), partial_mode=True)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
