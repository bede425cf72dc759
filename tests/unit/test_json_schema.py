"""The domain's JSON Schema checks and the schemas replies are generated under where a
schema asks for more than a grammar gives."""

from __future__ import annotations

import json

import pytest

from semantic.adapters.http.tool_translate import response_schema
from semantic.domain.constraints import UnsupportedSchemaError
from semantic.domain.json_schema import check_schema, check_strict_schema, loosened, ungenerated
from semantic.domain.tools import checked_tools


def test_a_loose_schema_keeps_all_but_what_a_grammar_cannot_honour() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string", "not": {"const": "x"}},
            "d": {"type": "string", "pattern": "^[a-z]+(?:-[a-z]+)*$"},
            "b": {"anyOf": [{"if": {"type": "null"}}, {"$ref": "https://x/y"}]},
            "c": {"$ref": "#/$defs/c"},
        },
        "items": [{"then": {}}],
        "$defs": {"c": {"type": "integer", "unevaluatedProperties": False}},
    }
    assert loosened(schema) == {
        "type": "object",
        "properties": {
            "a": {"type": "string"},
            "d": {"type": "string", "pattern": "^[a-z]+(?:-[a-z]+)*$"},
            "b": {"anyOf": [{}, {}]},
            "c": {"$ref": "#/$defs/c"},
        },
        "items": [{}],
        "$defs": {"c": {"type": "integer"}},
    }
    check_schema(loosened(schema), "loose", "response_format")


def test_uniqueness_is_refused_only_where_the_reply_is_promised_to_validate() -> None:
    tags = {"type": "object", "properties": {"t": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(UnsupportedSchemaError, match="uniqueItems"):
        check_strict_schema(tags, "strict", "response_format")
    keyed = {"type": "object", "additionalProperties": {"propertyNames": {"enum": ["a"]}}}
    with pytest.raises(UnsupportedSchemaError, match="propertyNames"):
        check_strict_schema(keyed, "strict", "response_format")
    strict = {"name": "a", "strict": True, "schema": tags}
    with pytest.raises(UnsupportedSchemaError, match="uniqueItems"):
        response_schema({"type": "json_schema", "json_schema": strict})
    loose = {"name": "a", "schema": tags}
    assert json.loads(response_schema({"type": "json_schema", "json_schema": loose}) or "") == tags
    assert checked_tools([("tag", None, tags, None)])[0].name == "tag"


@pytest.mark.parametrize(
    ("pattern", "generated"),
    [
        ("^[a-z]+(?:-[a-z]+)*$", True),
        ("(?P<word>[a-z]+)", True),
        ("(?i)abc", True),
        ("^(?!\\.)[a-z.]+@x$", False),  # zod's email pattern begins so
        ("(?<=a)b", False),
        ("(a)\\1", False),
    ],
)
def test_a_pattern_that_looks_around_or_back_is_generated_without(
    pattern: str, generated: bool
) -> None:
    assert ungenerated("pattern", pattern) is not generated
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": pattern}}}
    if generated:
        check_strict_schema(schema, "strict", "response_format")
    else:
        with pytest.raises(UnsupportedSchemaError, match="look-around"):
            check_strict_schema(schema, "strict", "response_format")
