"""The schema a generated call's arguments are held to: the tool's own, with every object
that lists its properties closed to others (``closed_objects``)."""

from __future__ import annotations

from typing import Any

_COMPOSING = frozenset(
    {
        "allOf",
        "anyOf",
        "oneOf",
        "$ref",
        "if",
        "then",
        "else",
        "not",
        "dependentSchemas",
        "dependencies",
        "dependentRequired",
    }
)
"""Keywords by which other schemas add to an object's keys: such an object stays open."""
_OTHER_KEYS = frozenset({"additionalProperties", "patternProperties", "unevaluatedProperties"})


def closed_objects(schema: Any) -> Any:
    """``schema`` with ``"additionalProperties": false`` on each object schema that lists
    ``properties``, says nothing of other keys and is not composed with others (``_COMPOSING``:
    a member of ``anyOf`` beside the object's own ``properties`` adds keys to it), here and
    in what it nests; a schema that uses ``allOf`` anywhere (inheritance through ``$ref``)
    is left as it is.

    JSON Schema lets an object hold keys it does not list; a model under a grammar then
    invents them (the embedded model wrote ``"temperature"`` into ``get_weather`` and
    copied the schema's own ``"type"``/``"properties"`` into its arguments until
    ``max_tokens``), and a call cut short is no call. OpenAI's strict mode requires the
    same closing of every object."""
    if _uses_all_of(schema):
        return schema
    return _closed(schema)


def _closed(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    composed = bool(_COMPOSING & set(schema))
    lists_keys = isinstance(schema.get("properties"), dict)
    out = {
        key: _closed_member(key, value, extended=composed and lists_keys)
        for key, value in schema.items()
    }
    required = out.get("required", [])
    listed = set(out["properties"]) if lists_keys else set()
    if lists_keys and not composed and not _OTHER_KEYS & set(out) and set(required) <= listed:
        out["additionalProperties"] = False
    return out


def _closed_member(key: str, value: Any, *, extended: bool) -> Any:
    """``extended``: the object lists keys that members of its composition extend, so the
    members stay open too."""
    if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
        return {name: _closed(sub) for name, sub in value.items()}
    if key in ("items", "prefixItems", "additionalProperties"):
        return _closed(value)
    if key in ("anyOf", "oneOf") and not extended:
        return _closed(value)
    return value


def _uses_all_of(schema: Any) -> bool:
    if isinstance(schema, list):
        return any(_uses_all_of(item) for item in schema)
    if not isinstance(schema, dict):
        return False
    return "allOf" in schema or any(_uses_all_of(value) for value in schema.values())
