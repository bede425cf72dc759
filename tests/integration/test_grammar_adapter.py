"""The llguidance adapter on the embedded model's vocabulary: what it refuses (naming the
keyword and the call), what it caches, and the masks it gives."""

from __future__ import annotations

import json

import pytest

from semantic.adapters.grammar.lark import FORMATS
from semantic.domain.constraints import OutputConstraint, TaggedSchema, UnsupportedSchemaError
from semantic.ports.grammar import GrammarCompiler, GrammarMatcher
from tests.integration.conftest import RealModel

pytestmark = pytest.mark.model

CITY = json.dumps(
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
)


def call(name: str, schema: str = CITY) -> TaggedSchema:
    return TaggedSchema(f'<tool_call>{{"name": "{name}", "arguments": ', schema, "}</tool_call>")


def allows(matcher: GrammarMatcher, token: int) -> bool:
    return bool(matcher.allowed()[token // 8] >> (token % 8) & 1)


def feed(real_model: RealModel, matcher: GrammarMatcher, text: str) -> bool:
    """Whether every token of ``text`` was allowed and accepted in turn."""
    for token in real_model.tokenizer.encode(text):
        if not allows(matcher, token) or not matcher.accept(token):
            return False
    return True


def test_a_keyword_the_engine_cannot_honour_is_named_with_its_call(
    grammars: GrammarCompiler,
) -> None:
    schema = json.dumps({"type": "object", "properties": {"a": {"not": {"type": "string"}}}})
    with pytest.raises(UnsupportedSchemaError, match="not") as caught:
        grammars.compile(OutputConstraint(calls=(call("a"), call("b", schema)), require_call=True))
    assert caught.value.keywords == ("not",)
    assert caught.value.call_index == 1


@pytest.mark.parametrize(
    ("constraint", "index"),
    [
        (OutputConstraint(json_schema="{not json"), None),
        (OutputConstraint(json_schema='"a string"'), None),
        (OutputConstraint(calls=(call("a"),), triggers=("<call>",)), 0),
    ],
)
def test_malformed_constraints_are_refused(
    grammars: GrammarCompiler, constraint: OutputConstraint, index: int | None
) -> None:
    with pytest.raises(UnsupportedSchemaError) as caught:
        grammars.compile(constraint)
    assert caught.value.call_index == index


def test_equal_constraints_share_one_compilation(grammars: GrammarCompiler) -> None:
    first = grammars.compile(OutputConstraint(json_schema=CITY))
    assert grammars.compile(OutputConstraint(json_schema=json.dumps(json.loads(CITY)))) is first


def test_a_complete_value_allows_only_the_end_of_turn(
    real_model: RealModel, grammars: GrammarCompiler
) -> None:
    (eos,) = real_model.tokenizer.eos_token_ids
    matcher = grammars.compile(OutputConstraint(json_schema=CITY)).matcher()
    assert not allows(matcher, eos)
    assert feed(real_model, matcher, '{"city": "Paris"}')
    bits = matcher.allowed()
    assert [t for t in range(len(bits) * 8) if bits[t // 8] >> (t % 8) & 1] == [eos]
    assert not matcher.done
    assert matcher.accept(eos)
    assert matcher.done


def test_max_calls_bounds_parallel_calls(real_model: RealModel, grammars: GrammarCompiler) -> None:
    constraint = OutputConstraint(calls=(call("a"), call("b")), require_call=True, max_calls=2)
    one = '<tool_call>{"name": "a", "arguments": {"city": "Rome"}}</tool_call>'
    two = one + "\n" + one.replace('"a"', '"b"')
    assert feed(real_model, grammars.compile(constraint).matcher(), two)
    assert not feed(real_model, grammars.compile(constraint).matcher(), two + "\n" + one)


def test_an_answer_of_the_schema_or_calls_and_nothing_else(
    real_model: RealModel, grammars: GrammarCompiler
) -> None:
    """Tools under ``auto`` beside a response format: the reply is a call from its first
    character, or one JSON value of the schema where free text would be."""
    answer = json.dumps(
        {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    )
    both = OutputConstraint(
        json_schema=answer, calls=(call("a"),), triggers=("<tool_call>",), max_calls=1
    )
    grammar = grammars.compile(both)
    assert feed(real_model, grammar.matcher(), '{"answer": "Paris"}')
    assert feed(
        real_model, grammar.matcher(), '<tool_call>{"name": "a", "arguments": {"city": "Rome"}}'
    )
    assert not feed(real_model, grammar.matcher(), "Paris is the capital.")
    assert not feed(real_model, grammar.matcher(), '{"city": "Rome"}')  # not the answer's schema
    assert not feed(real_model, grammar.matcher(), 'Sure. <tool_call>{"name": "a"')


def test_a_format_the_engine_writes_holds_and_any_other_is_an_annotation_as_is_uniqueness(
    real_model: RealModel, grammars: GrammarCompiler
) -> None:
    """pydantic writes ``path``, ``binary`` and ``password`` for ``Path``, ``bytes`` and
    ``SecretStr``, and ``uniqueItems`` for ``set``: a tool taking one compiles (its string
    any string, as JSON Schema reads an unknown format; its items free to repeat); each
    format of ``FORMATS`` is still generated as that format."""
    for known in FORMATS:
        grammars.compile(
            OutputConstraint(json_schema=json.dumps({"type": "string", "format": known}))
        )
    fields = {"path": "path", "data": "binary", "secret": "password", "day": "date"}
    properties: dict[str, object] = {
        name: {"type": "string", "format": kind} for name, kind in fields.items()
    }
    properties["tags"] = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    properties["counts"] = {"type": "object", "propertyNames": {"enum": ["a", "b"]}}
    properties["mail"] = {"type": "string", "format": "email", "pattern": "^(?!\\.)[^@]+@x$"}
    schema = {"type": "object", "properties": properties, "additionalProperties": False}
    schema["required"] = list(fields)
    constraint = OutputConstraint(calls=(call("save", json.dumps(schema)),), require_call=True)
    grammar = grammars.compile(constraint)
    written = (
        '<tool_call>{"name": "save", "arguments": {"path": "a.txt", "data": "xyz", "secret": "pw", '
    )
    assert feed(real_model, grammar.matcher(), written + '"day": "2024-01-31"}}</tool_call>')
    assert not feed(real_model, grammar.matcher(), written + '"day": "last week"}}</tool_call>')


def test_a_one_of_not_proven_disjoint_is_generated_as_any_of(
    real_model: RealModel, grammars: GrammarCompiler
) -> None:
    """OpenAPI's unions (as MCP servers built from them carry) are ``oneOf`` of objects
    whose keys are optional, which llguidance cannot prove disjoint and refuses unless told
    to read ``oneOf`` as ``anyOf``: each branch then, and nothing else."""
    branch = {
        "cat": {"kind": {"const": "cat", "type": "string"}, "lives": {"type": "integer"}},
        "dog": {"kind": {"const": "dog", "type": "string"}, "bark": {"type": "string"}},
    }
    pet = {
        "oneOf": [{"type": "object", "properties": props} for props in branch.values()],
        "discriminator": {"propertyName": "kind"},
    }
    schema = {"type": "object", "properties": {"pet": pet}, "required": ["pet"]}
    grammar = grammars.compile(OutputConstraint(json_schema=json.dumps(schema)))
    assert feed(real_model, grammar.matcher(), '{"pet": {"kind": "cat", "lives": 9}}')
    assert feed(real_model, grammar.matcher(), '{"pet": {"kind": "dog", "bark": "woof"}}')
    assert not feed(real_model, grammar.matcher(), '{"pet": 5}')
