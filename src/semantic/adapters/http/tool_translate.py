"""What a request's tools and ``response_format`` ask of the reply, for both edges: the
``OutputConstraint`` the engine generates under, and the format a reply's calls are read
in. The routes translate their protocol's shapes; the model's tool format (the
tokenizer's) says how a call is written."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from semantic.domain.constraints import OutputConstraint, UnsupportedSchemaError
from semantic.domain.errors import InvalidRequestError, PromptTooLongError
from semantic.domain.tools import ToolUse, check_schema
from semantic.ports.tokenizer import Tokenizer
from semantic.ports.tool_format import ToolFormat

JSON_OBJECT = json.dumps({"type": "object"})


@dataclass(frozen=True, slots=True)
class ReplyShape:
    constraint: OutputConstraint | None
    calls_in: ToolFormat | None
    """The format to read calls in; None where the reply may not call a tool."""


def reply_shape(
    tokenizer: Tokenizer, use: ToolUse | None, json_schema: str | None = None
) -> ReplyShape:
    """Tools the reply may call win over ``response_format``: an agent framework sends both
    (its tools, and its final answer's schema), and a reply that calls no tool is then
    free text under ``auto`` (ADR 0018)."""
    fmt = tokenizer.tool_format
    if use is not None and use.offered:
        return ReplyShape(fmt.constraint(use), fmt)
    if json_schema is not None:
        return ReplyShape(OutputConstraint(json_schema=json_schema), None)
    return ReplyShape(None, None)


def response_schema(response_format: dict[str, Any] | None) -> str | None:
    """OpenAI's ``response_format`` as the JSON Schema the reply must match (as JSON text),
    or None for free text; refused where malformed."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    allowed = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"}}
    if not isinstance(kind, str) or kind not in allowed:  # a list or object is no type either
        raise _bad_format(f"type must be 'text', 'json_object' or 'json_schema', got {kind!r}")
    extra = set(response_format) - allowed[str(kind)]
    if extra:
        raise _bad_format(f"a {kind!r} response_format has no field {sorted(extra)[0]!r}")
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT
    return _json_schema(response_format.get("json_schema"))


def _json_schema(spec: object) -> str:
    if not isinstance(spec, dict):
        raise _bad_format("json_schema must be an object with a name and a schema")
    unknown = set(spec) - {"name", "schema", "strict", "description"}
    if unknown:
        raise _bad_format(f"json_schema has no field {sorted(unknown)[0]!r}")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise _bad_format("json_schema.name must be a non-empty string")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise _bad_format("json_schema.strict must be true or false")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise _bad_format("json_schema.schema must be a JSON Schema object")
    if strict:
        check_schema(schema, "response_format.json_schema.schema", "response_format")
        return json.dumps(schema, ensure_ascii=False)
    try:  # not strict: a schema the grammar cannot honour still gets JSON
        check_schema(schema, "response_format.json_schema.schema", "response_format")
    except InvalidRequestError:
        return json.dumps({}, ensure_ascii=False)
    return json.dumps(schema, ensure_ascii=False)


def _bad_format(message: str) -> InvalidRequestError:
    return InvalidRequestError(f"response_format: {message}", param="response_format")


def no_room_for_tools(error: PromptTooLongError, use: ToolUse | None) -> PromptTooLongError:
    """A prompt too long for the context once its tools are listed names the tools."""
    if use is None or error.param != "messages":
        return error
    return PromptTooLongError(
        f"{error}; the {len(use.tools)} tools listed in the prompt leave no room", param="tools"
    )


def named_refusal(error: UnsupportedSchemaError, use: ToolUse | None) -> UnsupportedSchemaError:
    """A schema the grammar engine refused when it compiled the constraint, named by the
    request's own field: the tool whose parameters it is, or ``response_format``."""
    if error.param is not None:
        return error
    offered = use.offered if use is not None else ()
    if error.call_index is not None and error.call_index < len(offered):
        where = f"tools ({offered[error.call_index].name}): "
        param = "tools"
    else:
        where, param = ("tools: ", "tools") if offered else ("response_format: ", "response_format")
    return UnsupportedSchemaError(
        where + str(error), keywords=error.keywords, call_index=error.call_index, param=param
    )
