"""What a JSON Schema may ask of a reply generated under it: the checks a tool's or a
format's schema passes (``check_schema``, ``check_strict_schema``), and the schema a reply
is generated under where it asks for more than a grammar gives (``loosened``, ``pruned``).
The grammar engine (an adapter) may refuse more when it compiles (ADR 0017, 0018)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from semantic.domain.constraints import UnsupportedSchemaError
from semantic.domain.errors import InvalidRequestError

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
    """``check_schema``, and nothing a reply is generated without (``ungenerated``): what a
    reply promised to validate may use."""
    check_schema(schema, what, field)
    found: list[tuple[str, object]] = []

    def note(keyword: str, value: object) -> bool:
        if ungenerated(keyword, value):
            found.append((keyword, value))
        return True

    pruned(schema, note)
    if found:
        keyword, value = found[0]
        detail = f" {value!r} (look-around or a back-reference)" if keyword == "pattern" else ""
        raise _unsupported(keyword, what, field, detail)


def ungenerated(keyword: str, value: object) -> bool:
    """An assertion a reply is generated without: one of ``UNENFORCEABLE``, or a
    ``pattern`` that looks around or back, which no regular grammar (llguidance's regexes)
    can write; zod writes one for every ``.email()``."""
    if keyword == "pattern" and isinstance(value, str):
        return _NO_GRAMMAR_REGEX.search(value) is not None
    return keyword in UNENFORCEABLE


def loosened(schema: object) -> object:
    """``schema`` without the keywords a grammar cannot be promised to honour (a non-local
    ``$ref`` becomes any value): what a non-strict format is generated under, so that a
    reply keeps the shape the rest of the schema asks for instead of being any JSON at all
    (what it is generated without besides, ``ungenerated``, the grammar leaves out)."""
    return pruned(schema, _honoured)


def _honoured(keyword: str, value: object) -> bool:
    if keyword == "$ref":
        return isinstance(value, str) and value.startswith("#")
    return keyword not in UNSUPPORTED_KEYWORDS


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
