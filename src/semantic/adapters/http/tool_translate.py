"""OpenAI's ``response_format`` and Anthropic's ``output_config`` as the JSON Schema a reply
must match. What the schema and a request's tools then ask of the reply is the chat turn's
(``application.chat.reply_shape``)."""

from __future__ import annotations

import json
from typing import Any

from semantic.domain.errors import InvalidRequestError
from semantic.domain.json_schema import check_schema, check_strict_schema, loosened

JSON_OBJECT = json.dumps({"type": "object"})


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
    if not strict:  # generated around what the grammar cannot honour (ADR 0018)
        schema = loosened(schema)
    checked = check_strict_schema if strict else check_schema
    try:
        checked(schema, "response_format.json_schema.schema", "response_format")
    except InvalidRequestError:
        if strict:
            raise
        schema = {}  # malformed beyond loosening: still JSON, as OpenAI promises no more
    return json.dumps(schema, ensure_ascii=False)


def _bad_format(message: str) -> InvalidRequestError:
    return InvalidRequestError(f"response_format: {message}", param="response_format")


def output_config_schema(output_config: dict[str, Any] | None) -> str | None:
    """Anthropic's ``output_config``: its ``format`` (``json_schema``, always strict there)
    as the JSON Schema the reply must match, or None. ``effort`` asks for thinking this
    server does not do: only its absence is served."""
    if output_config is None:
        return None
    unknown = set(output_config) - {"format", "effort"}
    if unknown:
        raise _bad_config(f"has no field {sorted(unknown)[0]!r}")
    if output_config.get("effort") is not None:
        raise _bad_config("effort is not supported (no extended thinking here)")
    spec = output_config.get("format")
    if spec is None:
        return None
    if not isinstance(spec, dict) or spec.get("type") != "json_schema":
        raise _bad_config("format must be an object of type 'json_schema'")
    if set(spec) - {"type", "schema"}:
        raise _bad_config(f"format has no field {sorted(set(spec) - {'type', 'schema'})[0]!r}")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise _bad_config("format.schema must be a JSON Schema object")
    check_strict_schema(schema, "output_config.format.schema", "output_config")
    return json.dumps(schema, ensure_ascii=False)


def _bad_config(message: str) -> InvalidRequestError:
    return InvalidRequestError(f"output_config: {message}", param="output_config")
