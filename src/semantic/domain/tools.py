"""Tools a reply may call, and the calls in a conversation, as the domain sees them.

The OpenAI and Anthropic edges both translate their own shapes to these, so the model's
tool-call format (how tools are listed in the prompt and how a call is written) is chosen
once, by the model, not by the protocol. Checks that hold for every protocol (names, what
``tool_choice`` names; a schema's own in ``json_schema``) live here, so both edges refuse
alike.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass
from typing import Any

from semantic.domain.call_schema import closed_objects
from semantic.domain.errors import InvalidRequestError
from semantic.domain.json_schema import check_schema, check_strict_schema, loosened

TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
"""OpenAI's and Anthropic's rule for a function's name."""


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: str
    """The arguments' JSON Schema as JSON text (an object schema)."""

    @property
    def schema(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.parameters)
        return loaded

    @property
    def call_schema(self) -> str:
        """The arguments a generated call may hold, as JSON Schema text: ``parameters``
        without what a grammar cannot honour (``loosened``: a strict tool was refused with
        any), every object that lists its properties closed to others (``closed_objects``)."""
        return json.dumps(closed_objects(loosened(self.schema)), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call in a conversation: the id the reply gave it, the tool, its arguments as JSON
    text (as written, so what was generated can be matched)."""

    id: str
    name: str
    arguments: str


MAX_CALLS_PER_REPLY = 16
"""How many calls one reply may make when parallel calls are allowed (ADR 0018). Any tool
any number of times within it; a call identical to an earlier one ends the reply."""


class ToolChoice(enum.Enum):
    NONE = "none"
    AUTO = "auto"
    REQUIRED = "required"
    NAMED = "named"


@dataclass(frozen=True, slots=True)
class ToolUse:
    """The tools of one request and how the reply may use them."""

    tools: tuple[Tool, ...]
    choice: ToolChoice = ToolChoice.AUTO
    named: str | None = None
    parallel: bool = True

    @property
    def offered(self) -> tuple[Tool, ...]:
        """The tools the reply may call: the named one alone, all, or none."""
        if self.choice is ToolChoice.NONE:
            return ()
        if self.choice is ToolChoice.NAMED:
            return tuple(t for t in self.tools if t.name == self.named)
        return self.tools

    @property
    def must_call(self) -> bool:
        return self.choice in (ToolChoice.REQUIRED, ToolChoice.NAMED)


def tool_use(
    tools: tuple[Tool, ...],
    choice: ToolChoice,
    named: str | None,
    parallel: bool,
    *,
    choice_field: str = "tool_choice",
) -> ToolUse | None:
    """Checked: a choice that needs tools has them, and a named tool is one of them."""
    if not tools:
        if choice in (ToolChoice.REQUIRED, ToolChoice.NAMED):
            raise InvalidRequestError(f"{choice_field} needs tools", param=choice_field)
        return None
    if choice is ToolChoice.NAMED and named not in {t.name for t in tools}:
        raise InvalidRequestError(
            f"{choice_field} names {named!r}, which is not one of the tools", param=choice_field
        )
    return ToolUse(tools, choice, named, parallel)


def checked_tools(
    raw: list[tuple[object, object, object, object]], field: str = "tools"
) -> tuple[Tool, ...]:
    """Tools from (name, description, parameters, strict) as a request gave them; refused
    by ``field`` where a name is malformed or used twice, or a schema is not an object
    schema, or a strict one uses what a call generated under it may not match."""
    seen: set[str] = set()
    out = []
    for index, (name, description, parameters, strict) in enumerate(raw):
        where = f"{field}[{index}]"
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise InvalidRequestError(
                f"{where}: a tool name must match ^[a-zA-Z0-9_-]{{1,64}}$, got {name!r}",
                param=field,
            )
        if name in seen:
            raise InvalidRequestError(f"{where}: the tool name {name!r} is used twice", param=field)
        seen.add(name)
        if description is not None and not isinstance(description, str):
            raise InvalidRequestError(f"{where}: description must be a string", param=field)
        if strict is not None and not isinstance(strict, bool):
            raise InvalidRequestError(f"{where}: strict must be true or false", param=field)
        schema = {"type": "object", "properties": {}} if parameters is None else parameters
        check_object_schema(schema, f"{where} ({name})", field, strict=bool(strict))
        out.append(Tool(name, description or "", json.dumps(schema, ensure_ascii=False)))
    return tuple(out)


def check_object_schema(schema: object, what: str, field: str, *, strict: bool) -> None:
    """An object schema; a strict tool's may use only what its calls are generated under,
    a loose one's is generated without the rest (``Tool.call_schema``), as a loose
    ``response_format`` is: OpenAI's and Anthropic's non-strict tools take any schema."""
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise InvalidRequestError(
            f"{what}: the parameters must be a JSON Schema of an object "
            '({"type": "object", ...})',
            param=field,
        )
    if strict:
        check_strict_schema(schema, what, field)
    else:
        check_schema(loosened(schema), what, field)


def sent_back(arguments: str) -> str:
    """A call's arguments as a client sends them back in the history: the text it got,
    whatever it holds (OpenAI reads it as an opaque string; a call cut by ``max_tokens``
    comes back cut, and the OpenAI Agents SDK sends it so), and ``{}`` for the empty text
    some clients send for a tool without parameters."""
    return arguments if arguments.strip() else "{}"


def same_arguments(left: str, right: str) -> bool:
    """Whether two JSON texts hold the same value (spacing and key order aside)."""
    try:
        return bool(json.loads(left) == json.loads(right))
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class CallHead:
    """The start of a call read from a reply: the tool's name, and where the arguments'
    JSON text begins in the text it was read from."""

    name: str
    arguments_at: int
