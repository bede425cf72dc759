"""Tools a reply may call, and the calls in a conversation, as the domain sees them.

The OpenAI and Anthropic edges both translate their own shapes to these, so the model's
tool-call format (how tools are listed in the prompt and how a call is written) is chosen
once, by the model, not by the protocol. Checks that hold for every protocol (names,
schemas, what ``tool_choice`` names) live here, so both edges refuse alike.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from semantic.domain.call_schema import closed_objects
from semantic.domain.constraints import UnsupportedSchemaError
from semantic.domain.errors import InvalidRequestError

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
        """The arguments a generated call may hold, as JSON Schema text: ``parameters`` with
        every object that lists its properties closed to others (``closed_objects``)."""
        return json.dumps(closed_objects(self.schema), ensure_ascii=False)


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
    raw: list[tuple[object, object, object]], field: str = "tools"
) -> tuple[Tool, ...]:
    """Tools from (name, description, parameters) as a request gave them; refused by
    ``field`` where a name is malformed or used twice, or a schema is not an object schema
    or uses what output constrained to it cannot honour."""
    seen: set[str] = set()
    out = []
    for index, (name, description, parameters) in enumerate(raw):
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
        schema = {"type": "object", "properties": {}} if parameters is None else parameters
        check_object_schema(schema, f"{where} ({name})", field)
        out.append(Tool(name, description or "", json.dumps(schema, ensure_ascii=False)))
    return tuple(out)


def check_object_schema(schema: object, what: str, field: str) -> None:
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise InvalidRequestError(
            f"{what}: the parameters must be a JSON Schema of an object "
            '({"type": "object", ...})',
            param=field,
        )
    check_schema(schema, what, field)


UNSUPPORTED_KEYWORDS = frozenset(
    {
        "$dynamicRef",
        "$recursiveRef",
        "if",
        "then",
        "else",
        "not",
        "dependentSchemas",
        "unevaluatedProperties",
        "unevaluatedItems",
    }
)
"""Keywords output constrained to a schema is not promised to honour: refused up front
rather than generated around (the grammar engine may refuse more when it compiles)."""

UNENFORCEABLE = frozenset(
    {
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "propertyNames",
        "dependentRequired",
        "dependencies",
    }
)
"""Assertions a reply is not generated under: uniqueness, which no grammar can remember,
and what the grammar engine does not implement. A strict format, whose reply must
validate, is refused with one; a tool's arguments and a loose format's reply are generated
without them, a superset of what they allow (pydantic writes ``uniqueItems`` for every
``set`` and ``propertyNames`` for a ``dict`` keyed by an enum; a client's own validation
then has the last word, as it has against any server's non-strict tools)."""

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_VALUES = ("items", "additionalProperties", "contains", "propertyNames", "not")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")


def check_schema(schema: object, what: str, field: str) -> None:
    """A JSON Schema that a grammar can be built from: an object (or boolean), no keyword
    of ``UNSUPPORTED_KEYWORDS``, references only within the document."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise InvalidRequestError(f"{what}: a JSON Schema must be an object", param=field)
    for keyword in schema:
        if keyword in UNSUPPORTED_KEYWORDS:
            raise _unsupported(keyword, what, field)
    ref = schema.get("$ref")
    if ref is not None and (not isinstance(ref, str) or not ref.startswith("#")):
        raise _unsupported("$ref", what, field, f" to {ref!r} (only '#...' within the schema)")
    for name in _SCHEMA_MAPS:
        for sub in _mapping(schema.get(name), what, name, field).values():
            check_schema(sub, what, field)
    for name in _SCHEMA_VALUES:
        if name in schema and isinstance(schema[name], dict | bool):
            check_schema(schema[name], what, field)
    for name in (*_SCHEMA_LISTS, "items"):
        if isinstance(schema.get(name), list):
            for sub in schema[name]:
                check_schema(sub, what, field)


_NO_GRAMMAR_REGEX = re.compile(r"\(\?<?[=!]|\\[1-9]")
"""Look-around and back-references: what no regular grammar (llguidance's regexes) has."""


def check_strict_schema(schema: object, what: str, field: str) -> None:
    """``check_schema``, and no assertion a grammar cannot make (``UNENFORCEABLE``): what a
    reply promised to validate may use."""
    check_schema(schema, what, field)
    used: set[str] = set()

    def note(keyword: str, _: object) -> bool:
        if keyword in UNENFORCEABLE:
            used.add(keyword)
        return True

    pruned(schema, note)
    if used:
        raise _unsupported(sorted(used)[0], what, field)


def loosened(schema: object) -> object:
    """``schema`` without the keywords a grammar cannot honour (a non-local ``$ref`` becomes
    any value, a ``pattern`` that looks around or back no pattern): what a non-strict
    format is generated under, so that a reply keeps the shape the rest of the schema asks
    for instead of being any JSON at all."""
    return pruned(schema, _honoured)


def _honoured(keyword: str, value: object) -> bool:
    if keyword in UNSUPPORTED_KEYWORDS:
        return False
    if keyword == "$ref":
        return isinstance(value, str) and value.startswith("#")
    if keyword == "pattern" and isinstance(value, str):
        return _NO_GRAMMAR_REGEX.search(value) is None
    return True


def pruned(schema: object, keep: Callable[[str, object], bool]) -> object:
    """``schema`` with every keyword ``keep`` refuses left out, in it and in each of its
    subschemas (never inside a value such as ``const`` or ``enum``, which is data)."""
    if not isinstance(schema, dict):
        return schema
    return {
        keyword: _pruned_value(keyword, value, keep)
        for keyword, value in schema.items()
        if keep(keyword, value)
    }


def _pruned_value(keyword: str, value: object, keep: Callable[[str, object], bool]) -> object:
    if keyword in _SCHEMA_MAPS and isinstance(value, dict):
        return {name: pruned(sub, keep) for name, sub in value.items()}
    if keyword in (*_SCHEMA_VALUES, *_SCHEMA_LISTS) and isinstance(value, list):
        return [pruned(sub, keep) for sub in value]
    return pruned(value, keep) if keyword in _SCHEMA_VALUES else value


def _unsupported(keyword: str, what: str, field: str, detail: str = "") -> UnsupportedSchemaError:
    return UnsupportedSchemaError(
        f"{what}: the JSON Schema keyword {keyword!r}{detail} is not supported in "
        "constrained output",
        keywords=(keyword,),
        param=field,
    )


def _mapping(value: object, what: str, name: str, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{what}: {name!r} must be an object", param=field)
    return value


def is_json_object(text: str) -> bool:
    """Whether ``text`` is a JSON object (a call's arguments sent back must be one)."""
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


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
