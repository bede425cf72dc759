"""An ``OutputConstraint`` written as an llguidance Lark grammar.

A JSON-schema constraint is one ``%json`` value. Tool calls are alternatives of
``begin``, arguments (``%json``), ``end``, up to ``max_calls`` of them one per line. Under
``auto`` (triggers, no ``require_call``) the reply is either free text holding no trigger,
or free text up to the first trigger (a lazy lexeme: it ends where the trigger does) and a
call completed from there: the model chooses, and once it has written a trigger the rest of
the call is constrained. Under ``auto`` with a schema the free text gives way to an answer
of it: the reply is that JSON value, or its calls from the first character.

JSON is written the way ``json.dumps`` writes it (``", "`` and ``": "``, no other
whitespace): a model writes the JSON it has seen most, and flexible whitespace would let a
small model pad a value with blank lines until it runs out of tokens.
"""

from __future__ import annotations

import json
from typing import Any, cast

from semantic.domain.constraints import OutputConstraint, TaggedSchema, UnsupportedSchemaError
from semantic.domain.json_schema import pruned, ungenerated

JSON_STYLE = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "coerce_one_of": True,
}
"""How llguidance writes JSON: as ``json.dumps`` does (above); and a ``oneOf`` it cannot
prove disjoint as ``anyOf`` rather than refuse it (OpenAPI's unions of objects with
optional keys, which MCP servers built from a spec carry): a reply of overlapping branches
may then match more than one (ADR 0017)."""
FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid", "uri"}
)
"""The string formats llguidance generates (it refuses a grammar with any other: measured on
1.9.1, and a test compiles each). JSON Schema makes ``format`` an annotation unless a schema
asks for its assertion, so any other (pydantic writes ``path``, ``binary``, ``password``
for ``Path``, ``bytes``, ``SecretStr``) is left out: the string is any string."""
CALL_SEPARATOR = "\n"
"""Between parallel calls."""


def lark_for(constraint: OutputConstraint) -> str:
    if constraint.json_schema is not None and not constraint.calls:
        return f"start: {_json(constraint.json_schema, None)}\n"
    tail = "" if constraint.max_calls == 1 else " tail"
    lines = [_calls_rule(constraint)]
    for index, call in enumerate(constraint.calls):
        lines.append(f"call_{index}: {_literal(call.begin)} args_{index} {_literal(call.end)}")
        lines.append(f"args_{index}: {_json(call.schema, index)}")
    if constraint.require_call:
        lines.insert(0, f"start: call{tail}")
        return "\n".join(lines) + "\n"
    if constraint.json_schema is not None:
        lines.insert(0, f"start: answer | call{tail}")
        lines.append(f"answer: {_json(constraint.json_schema, None)}")
        return "\n".join(lines) + "\n"
    triggers = constraint.triggers
    lines.insert(0, "start: free | " + " | ".join(_after_trigger(constraint, tail)))
    lines.append(f"free: FREE\nFREE: /(?s:.*)/ & ~/(?s:.*({_alternatives(triggers)}).*)/")
    for position, trigger in enumerate(triggers):
        lines.append(f"pre_{position}[lazy]: /(?s:.*){_regex(trigger)}/")
    for index, call in enumerate(constraint.calls):
        position = _trigger_of(call, triggers, index)
        rest = call.begin[len(triggers[position]) :]
        opening = f"{_literal(rest)} " if rest else ""
        lines.append(f"rest_{index}: {opening}args_{index} {_literal(call.end)}")
    return "\n".join(lines) + "\n"


def _calls_rule(constraint: OutputConstraint) -> str:
    """``call`` (any one of them) and ``tail`` (the further calls, when more may follow)."""
    rule = "call: " + " | ".join(f"call_{i}" for i in range(len(constraint.calls)))
    more = constraint.max_calls
    if more == 1:
        return rule
    separated = f"({_literal(CALL_SEPARATOR)} call)"
    return rule + "\ntail: " + (f"{separated}*" if more is None else f"{separated}{{0,{more - 1}}}")


def _after_trigger(constraint: OutputConstraint, tail: str) -> list[str]:
    return [
        f"pre_{_trigger_of(call, constraint.triggers, i)} rest_{i}{tail}"
        for i, call in enumerate(constraint.calls)
    ]


def _trigger_of(call: TaggedSchema, triggers: tuple[str, ...], index: int) -> int:
    for position, trigger in enumerate(triggers):
        if trigger and call.begin.startswith(trigger):
            return position
    raise UnsupportedSchemaError(
        f"call {index} begins with {call.begin[:40]!r}, which starts with no trigger",
        call_index=index,
    )


def _json(schema_text: str, index: int | None) -> str:
    try:
        schema: Any = json.loads(schema_text)
    except ValueError as error:
        raise UnsupportedSchemaError(f"the schema is not JSON: {error}", call_index=index) from None
    if isinstance(schema, dict):
        schema = as_generated(schema)
    elif not isinstance(schema, bool):
        raise UnsupportedSchemaError("a JSON Schema is an object or a boolean", call_index=index)
    return "%json " + json.dumps(schema, ensure_ascii=False)


def as_generated(schema: dict[str, Any]) -> dict[str, Any]:
    """An object schema as llguidance is given it: formats it does not write and assertions
    it cannot make left out, JSON written as ``json.dumps`` writes it."""
    return {**cast("dict[str, Any]", pruned(schema, _generated)), "x-guidance": JSON_STYLE}


def _generated(keyword: str, value: object) -> bool:
    if keyword == "format" and isinstance(value, str):
        return value in FORMATS
    return not ungenerated(keyword, value)


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _alternatives(texts: tuple[str, ...]) -> str:
    return "|".join(_regex(text) for text in texts)


def _regex(text: str) -> str:
    """``text`` matched literally: every character other than an ASCII letter or digit is
    written as its code point, so nothing in it is a regex or Lark delimiter."""
    return "".join(c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):X}}}" for c in text)
