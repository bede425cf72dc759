"""What a request's tools and schema ask of the reply: the ``OutputConstraint`` the engine
generates under and the format its calls are read in; and a refusal of either, named by
the request's own field. The model's tool format says how a call is written."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from semantic.domain.constraints import OutputConstraint, UnsupportedSchemaError
from semantic.domain.errors import PromptTooLongError
from semantic.domain.tools import ToolUse
from semantic.ports.tool_format import ToolFormat


@dataclass(frozen=True, slots=True)
class ReplyShape:
    constraint: OutputConstraint | None
    calls_in: ToolFormat | None
    """The format to read calls in; None where the reply may not call a tool."""


FREE = ReplyShape(None, None)


def reply_shape(fmt: ToolFormat, use: ToolUse | None, json_schema: str | None = None) -> ReplyShape:
    """Tools and a schema together: an agent framework sends both (its tools, and its final
    answer's schema), and a reply that calls no tool is then an answer of the schema; a
    reply that must call one has no answer (ADR 0018)."""
    if use is not None and use.offered and (calls := fmt.constraint(use)) is not None:
        if json_schema is not None and not calls.require_call:
            calls = dataclasses.replace(calls, json_schema=json_schema)
        return ReplyShape(calls, fmt)
    if json_schema is not None:
        return ReplyShape(OutputConstraint(json_schema=json_schema), None)
    return FREE


def no_room_for_tools(error: PromptTooLongError, use: ToolUse | None) -> PromptTooLongError:
    """A prompt too long for the context once its tools are listed names the tools."""
    if use is None or error.param != "messages":
        return error
    return PromptTooLongError(
        f"{error}; the {len(use.tools)} tools listed in the prompt leave no room", param="tools"
    )


def named_refusal(
    error: UnsupportedSchemaError, use: ToolUse | None, shape: ReplyShape
) -> UnsupportedSchemaError:
    """A schema the grammar engine refused when it compiled the constraint, named by the
    request's own field: the tool whose parameters it is, or ``response_format``."""
    if error.param is not None:
        return error
    offered = use.offered if use is not None else ()
    answers = shape.constraint is not None and shape.constraint.json_schema is not None
    if error.call_index is not None and error.call_index < len(offered):
        where = f"tools ({offered[error.call_index].name}): "
        param = "tools"
    else:
        where, param = ("response_format: ", "response_format") if answers else ("tools: ", "tools")
    return UnsupportedSchemaError(
        where + str(error), keywords=error.keywords, call_index=error.call_index, param=param
    )
