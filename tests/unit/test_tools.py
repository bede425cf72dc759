"""Tools on the edge: checks every protocol shares, the default tool-call format, reading a
reply's calls as it streams, and the memory that renders a generated call again."""

from __future__ import annotations

import itertools
import json

import pytest

from semantic.adapters.grammar.lark import lark_for
from semantic.adapters.http.tool_translate import response_schema
from semantic.adapters.tool_formats import DefaultFormat, format_for
from semantic.application.chat.call_memory import CallMemory
from semantic.application.chat.generation import TextDelta
from semantic.application.chat.reply_shape import named_refusal, reply_shape
from semantic.application.chat.tool_replies import (
    ArgumentsDelta,
    Call,
    CallOpened,
    Reply,
    ReplyReader,
)
from semantic.domain.chat import ChatMessage, check_tool_answers
from semantic.domain.constraints import UnsupportedSchemaError
from semantic.domain.errors import InvalidRequestError
from semantic.domain.tools import (
    MAX_CALLS_PER_REPLY,
    Tool,
    ToolCall,
    ToolChoice,
    ToolUse,
    checked_tools,
    tool_use,
)
from tests.unit.storage_fakes import FakeMetadataStore

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


_COUNTER = itertools.count()


def use(tools: tuple[Tool, ...], choice: ToolChoice, named: str | None, parallel: bool) -> ToolUse:
    found = tool_use(tools, choice, named, parallel)
    assert found is not None
    return found


def new_id() -> str:
    return f"call_{next(_COUNTER)}"


@pytest.mark.parametrize(
    ("tools", "says"),
    [
        ([("get weather", None, WEATHER, None)], "must match"),
        ([("x" * 65, None, WEATHER, None)], "must match"),
        ([("a", None, WEATHER, None), ("a", None, WEATHER, None)], "used twice"),
        ([("a", None, {"type": "string"}, None)], "JSON Schema of an object"),
        ([("a", None, [1], None)], "JSON Schema of an object"),
        ([("a", None, {"type": "object", "not": {}}, True)], "'not'"),
        ([("a", None, {"properties": {"b": {"$ref": "https://x.org/s.json"}}}, True)], "'$ref'"),
        ([("a", None, {"properties": {"b": {"uniqueItems": True}}}, True)], "'uniqueItems'"),
        ([("a", None, WEATHER, "yes")], "strict must be true or false"),
        ([("a", 3, WEATHER, None)], "description"),
    ],
)
def test_malformed_tools_are_refused_naming_the_field(tools: list, says: str) -> None:  # type: ignore[type-arg]  # tuples as a request gives them
    with pytest.raises(InvalidRequestError, match="tools") as refused:
        checked_tools(tools)
    assert refused.value.param == "tools"
    assert says in str(refused.value)


def test_unsupported_keywords_are_their_own_error_and_local_refs_pass() -> None:
    with pytest.raises(UnsupportedSchemaError) as refused:
        checked_tools([("a", None, {"type": "object", "if": {}}, True)])
    assert refused.value.keywords == ("if",)
    schema = {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}}, "$defs": {"n": {}}}
    assert checked_tools([("a", None, schema, None)])[0].schema == schema
    named_not = {"type": "object", "properties": {"not": {"type": "string"}}}
    assert checked_tools([("a", None, named_not, None)])  # a property may be called "not"


def test_a_loose_tool_is_called_under_its_schema_without_what_no_grammar_honours() -> None:
    """OpenAI's and Anthropic's non-strict tools take any schema (zod's ``z.never()`` writes
    ``not: {}``): the model is shown it whole, and its calls are generated under the rest."""
    schema = {
        "type": "object",
        "properties": {
            "when": {"type": "string", "not": {"const": ""}},
            "mode": {"if": {"const": "a"}, "then": {}, "enum": ["a", "b"]},
            "far": {"$ref": "https://x.org/s.json"},
        },
        "required": ["when"],
    }
    [tool] = checked_tools([("plan", None, schema, False)])
    assert tool.schema == schema
    called = json.loads(tool.call_schema)["properties"]
    assert called["when"] == {"type": "string"}
    assert called["mode"] == {"enum": ["a", "b"]}
    assert called["far"] == {}


def test_tool_choice_must_name_one_of_the_tools() -> None:
    tools = checked_tools([("get_weather", "Weather", WEATHER, None)])
    with pytest.raises(InvalidRequestError, match="not one of the tools"):
        tool_use(tools, ToolChoice.NAMED, "get_time", True)
    with pytest.raises(InvalidRequestError, match="needs tools"):
        tool_use((), ToolChoice.REQUIRED, None, True)
    assert tool_use((), ToolChoice.AUTO, None, True) is None


def test_a_tool_message_must_answer_an_earlier_call() -> None:
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    asked = [ChatMessage("user", "Hi"), ChatMessage("assistant", "", tool_calls=(call,))]
    check_tool_answers([*asked, ChatMessage("tool", "Sunny", tool_call_id="call_1")])
    with pytest.raises(InvalidRequestError, match="answers no call"):
        check_tool_answers([*asked, ChatMessage("tool", "Sunny", tool_call_id="call_2")])


def test_the_default_format_constrains_and_reads_its_own_calls() -> None:
    fmt = DefaultFormat()
    tools = checked_tools(
        [("get_weather", "Weather", WEATHER, None), ("get_time", None, None, None)]
    )
    required = fmt.constraint(use(tools, ToolChoice.REQUIRED, None, False))
    assert required is not None
    assert required.require_call
    assert required.max_calls == 1
    assert [c.begin for c in required.calls] == [
        '<tool_call>{"name": "get_weather", "arguments": ',
        '<tool_call>{"name": "get_time", "arguments": ',
    ]
    assert {c.end for c in required.calls} == {"}</tool_call>"}
    named = fmt.constraint(use(tools, ToolChoice.NAMED, "get_time", True))
    assert named is not None
    assert named.calls[0].begin.endswith('"get_time", "arguments": ')
    auto = fmt.constraint(use(tools, ToolChoice.AUTO, None, True))
    assert auto is not None
    assert auto.triggers == ("<tool_call>",)
    assert auto.max_calls == MAX_CALLS_PER_REPLY  # any tool, several times
    assert auto.end_on_repeat
    assert required.end_on_repeat
    assert not auto.require_call
    assert fmt.constraint(use(tools, ToolChoice.NONE, None, True)) is None
    written = required.calls[0].begin + '{"city":"Paris"}' + required.calls[0].end
    head = fmt.read_head(" " + written, 0)
    assert head is not None
    assert head.name == "get_weather"
    assert written[head.arguments_at - 1 :].startswith('{"city"')
    assert fmt.read_tail(written, written.index("}}") + 1) == len(written)
    assert fmt.read_tail(written[:-3], written.index("}}") + 1) is None  # the tag is cut
    for no_head in (written[:30], '<tool_call>{"name": 1}', "text <tool_call>"):
        assert fmt.read_head(no_head, 0) is None


def test_call_schemas_close_objects_that_list_their_properties() -> None:
    schema = {
        "type": "object",
        "properties": {
            "where": {"type": "object", "properties": {"city": {"type": "string"}}},
            "tags": {"type": "array", "items": {"type": "object", "properties": {}}},
            "free": {"type": "object", "additionalProperties": {"type": "integer"}},
            "either": {"anyOf": [{"type": "object", "properties": {"a": {}}}, {"type": "null"}]},
        },
    }
    [tool] = checked_tools([("f", None, schema, None)])
    closed = json.loads(tool.call_schema)
    assert closed["additionalProperties"] is False
    where, tags = closed["properties"]["where"], closed["properties"]["tags"]["items"]
    assert where["additionalProperties"] is False
    assert tags["additionalProperties"] is False
    assert closed["properties"]["free"]["additionalProperties"] == {"type": "integer"}
    assert closed["properties"]["either"]["anyOf"][0]["additionalProperties"] is False
    assert tool.schema == schema  # the prompt shows the tool as it was given


def test_objects_that_others_extend_stay_open() -> None:
    """Members of a composition beside the object's own keys add keys to it; ``allOf``
    anywhere (inheritance through ``$ref``); a ``required`` key the object does not list."""
    kinds = {
        "type": "object",
        "properties": {"kind": {"type": "string"}},
        "oneOf": [
            {"properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["x"]},
            {"properties": {"kind": {"const": "b"}, "y": {"type": "integer"}}, "required": ["y"]},
        ],
    }
    inherited = {
        "$defs": {"Base": {"type": "object", "properties": {"a": {}}}},
        "allOf": [{"$ref": "#/$defs/Base"}, {"properties": {"b": {}}}],
    }
    unlisted = {"type": "object", "properties": {"a": {}}, "required": ["a", "b"]}
    for schema in (kinds, inherited, unlisted):
        [tool] = checked_tools([("f", None, schema, None)])
        assert json.loads(tool.call_schema) == schema


def test_the_default_format_renders_calls_and_results_as_plain_turns() -> None:
    fmt = DefaultFormat()
    tools = checked_tools([("get_weather", "Weather", WEATHER, None)])
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    turns, listed = fmt.render(
        [
            ChatMessage("user", "Weather?"),
            ChatMessage("assistant", "Let me look.", tool_calls=(call,)),
            ChatMessage("tool", "Sunny", tool_call_id="call_1"),
        ],
        tools,
    )
    assert listed is None
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "user"]
    assert '"name": "get_weather"' in turns[0]["content"]
    assert turns[2]["content"] == (
        'Let me look.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}'
        "</tool_call>"
    )
    assert turns[3]["content"] == "<tool_response>\nSunny\n</tool_response>"


def test_templates_that_take_tools_get_their_family_format() -> None:
    assert format_for("{{ messages }}").name == "default"
    assert format_for("{% if tools %}<tool_call>{% endif %}").name == "hermes"
    assert format_for("{% if tools %}[TOOL_CALLS]{% endif %}").name == "mistral"
    assert format_for('{% if tools %}"parameters"<|python_tag|>{% endif %}').name == "llama3"


CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def read(pieces: list[str], fmt: DefaultFormat | None, *, cut: bool = False) -> tuple[str, Reply]:
    reader = ReplyReader(fmt, new_id)
    events = [event for piece in pieces for event in reader.feed(piece)]
    rest, reply = reader.finish(cut=cut)
    return "".join(e.text for e in [*events, *rest] if isinstance(e, TextDelta)), reply


def test_the_reader_passes_text_on_and_each_call_as_it_forms() -> None:
    pieces = [
        "Let me ",
        "look.\n<tool",
        '_call>{"name": ',
        '"get_weather", "arguments": {"ci',
        'ty": "Paris"}}</tool_call>',
    ]
    reader = ReplyReader(DefaultFormat(), lambda: "call_1")
    shown = [reader.feed(p) for p in pieces]
    assert shown == [
        [TextDelta("Let me")],  # spaces held until text follows
        [TextDelta(" look.")],
        [],
        [CallOpened(0, "call_1", "get_weather"), ArgumentsDelta(0, '{"ci')],
        [ArgumentsDelta(0, 'ty": "Paris"}')],  # as the text came, without the closing
    ]
    rest, reply = reader.finish()
    assert rest == []
    assert reply.content == "Let me look."
    assert reply.raw == "".join(pieces)
    assert reply.calls == (Call("call_1", "get_weather", '{"city": "Paris"}'),)


def test_a_reply_cut_inside_a_call_keeps_the_call_as_far_as_it_came() -> None:
    shown, reply = read(["Sure. ", CALL[:60]], DefaultFormat(), cut=True)
    assert shown == "Sure."
    [call] = reply.calls
    assert (call.name, call.arguments, call.complete) == ("get_weather", '{"city": "Pa', False)
    assert reply.cut_in_a_call


def test_a_call_cut_before_its_tools_name_is_never_shown_as_text() -> None:
    shown, reply = read(["Sure. ", CALL[:30]], DefaultFormat(), cut=True)
    assert (shown, reply.content, reply.calls) == ("Sure.", "Sure.", ())
    assert reply.raw == "Sure. " + CALL[:30]  # rendered again as it was generated
    _, reply = read([CALL, "\n", CALL[:30]], DefaultFormat(), cut=True)  # after whole calls
    assert [c.complete for c in reply.calls] == [True]
    assert reply.cut_in_a_call  # the limit's finish: more calls may have followed
    _, ended = read([CALL, "\n", CALL], DefaultFormat())  # a repeat the grammar ended
    assert [c.complete for c in ended.calls] == [True]
    assert not ended.cut_in_a_call


def test_a_trigger_that_began_no_call_is_text_when_the_model_ended_there() -> None:
    shown, reply = read(["Sure. ", CALL[:30]], DefaultFormat())
    assert (shown, reply.calls) == ("Sure. " + CALL[:30], ())


def test_a_call_repeating_an_earlier_one_is_dropped_and_others_are_kept() -> None:
    other = CALL.replace("Paris", "Lima")
    quoted = CALL.replace('"Paris"', '"P\\"}aris"')  # a brace and a quote inside a string
    _, reply = read([CALL, "\n", other[:70], other[70:], "\n", CALL], DefaultFormat())
    assert [json.loads(c.arguments)["city"] for c in reply.calls] == ["Paris", "Lima"]
    _, reply = read([quoted, "\n", CALL], DefaultFormat())
    assert [json.loads(c.arguments)["city"] for c in reply.calls] == ['P"}aris', "Paris"]


def test_text_that_only_looks_like_a_call_start_is_passed_on() -> None:
    shown, _ = read(["a <tool", " b"], DefaultFormat())
    assert shown == "a <tool b"
    assert read(["plain ", "text"], None)[0] == "plain text"


async def test_a_generated_call_is_rendered_as_written_when_sent_back() -> None:
    store = FakeMetadataStore()
    memory = CallMemory(store)
    call_text = '{"name": "get_weather", "arguments": {"city":"Paris","days":2}}'
    raw = f"Looking.<tool_call>{call_text}</tool_call>"
    reader = ReplyReader(DefaultFormat(), new_id)
    reader.feed(raw)
    _, reply = reader.finish()
    await memory.remember("ns", reply)
    [call] = reply.calls
    resent = json.dumps({"days": 2, "city": "Paris"}, indent=1)  # other spacing and order
    back = ChatMessage("assistant", "Looking.", tool_calls=(ToolCall(call.id, call.name, resent),))
    asked = ChatMessage("user", "Weather?")
    assert await memory.restore("ns", [asked, back]) == [asked, ChatMessage("assistant", raw)]
    for changed in (
        ChatMessage("assistant", "Looking.", tool_calls=(ToolCall(call.id, call.name, "{}"),)),
        ChatMessage("assistant", "Other.", tool_calls=(ToolCall(call.id, call.name, resent),)),
    ):
        assert await memory.restore("ns", [changed]) == [changed]
    assert await memory.restore("other", [back]) == [back]  # kept per namespace


@pytest.mark.parametrize(
    ("response_format", "says"),
    [
        ({"type": "xml"}, "type must be"),
        ({"type": ["json_object"]}, "type must be"),
        ({"type": {"a": 1}}, "type must be"),
        ({"type": "json_object", "schema": {}}, "no field 'schema'"),
        ({"type": "json_schema"}, "json_schema must be an object"),
        ({"type": "json_schema", "json_schema": {"schema": {}}}, "name"),
        ({"type": "json_schema", "json_schema": {"name": "a", "schema": []}}, "schema"),
        ({"type": "json_schema", "json_schema": {"name": "a", "strict": "yes"}}, "strict"),
        ({"type": "json_schema", "json_schema": {"name": "a", "extra": 1}}, "no field 'extra'"),
    ],
)
def test_a_malformed_response_format_is_refused(response_format: dict, says: str) -> None:  # type: ignore[type-arg]  # as a request gives it
    with pytest.raises(InvalidRequestError) as refused:
        response_schema(response_format)
    assert refused.value.param == "response_format"
    assert says in str(refused.value)


def test_response_formats_become_schemas() -> None:
    assert response_schema(None) is None
    assert response_schema({"type": "text"}) is None
    assert json.loads(response_schema({"type": "json_object"}) or "") == {"type": "object"}
    strict = {"name": "a", "strict": True, "schema": WEATHER}
    assert (
        json.loads(response_schema({"type": "json_schema", "json_schema": strict}) or "") == WEATHER
    )
    unsupported = {"type": "object", "not": {"type": "null"}}
    with pytest.raises(UnsupportedSchemaError):
        response_schema({"type": "json_schema", "json_schema": {**strict, "schema": unsupported}})
    loose = {"name": "a", "strict": False, "schema": unsupported}
    assert json.loads(response_schema({"type": "json_schema", "json_schema": loose}) or "") == {
        "type": "object"
    }
    malformed = {"name": "a", "strict": False, "schema": {"properties": []}}
    assert response_schema({"type": "json_schema", "json_schema": malformed}) == "{}"


def test_a_schema_the_engine_refuses_is_named_by_the_requests_field() -> None:
    tools = checked_tools([("get_weather", None, WEATHER, None), ("get_time", None, None, None)])
    compiled = UnsupportedSchemaError("keyword 'format' refused", keywords=("format",))
    offered = use(tools, ToolChoice.AUTO, None, True)
    calls = reply_shape(DefaultFormat(), offered)
    named = named_refusal(
        UnsupportedSchemaError("x", keywords=("format",), call_index=1), offered, calls
    )
    assert named.param == "tools"
    assert "get_time" in str(named)
    assert named.keywords == ("format",)
    assert named_refusal(compiled, offered, calls).param == "tools"
    answer = reply_shape(DefaultFormat(), None, json.dumps(WEATHER))
    assert named_refusal(compiled, None, answer).param == "response_format"
    both = reply_shape(DefaultFormat(), offered, json.dumps(WEATHER))
    assert named_refusal(compiled, offered, both).param == "response_format"


def test_tools_under_auto_and_a_schema_ask_for_calls_or_an_answer_of_it() -> None:
    tools = checked_tools([("get_weather", None, WEATHER, None)])
    schema = json.dumps({"type": "object", "properties": {"answer": {"type": "string"}}})
    auto = reply_shape(DefaultFormat(), use(tools, ToolChoice.AUTO, None, True), schema)
    assert auto.constraint is not None
    assert auto.constraint.json_schema == schema
    assert auto.calls_in is not None  # its calls are read as ever
    assert auto.constraint.calls
    grammar = lark_for(auto.constraint)
    assert grammar.startswith("start: answer | call")
    assert "free" not in grammar  # no free text: an answer of the schema instead
    required = reply_shape(DefaultFormat(), use(tools, ToolChoice.REQUIRED, None, True), schema)
    assert required.constraint is not None
    assert required.constraint.json_schema is None  # a call is due: no answer to shape


@pytest.mark.parametrize(
    ("template", "written"),
    [
        (
            "tools <tool_call>",
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
        ),
        (
            "tools [TOOL_CALLS]",
            '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}]',
        ),
        ('tools "parameters"', '{"name": "get_weather", "parameters": {"city": "Oslo"}}'),
    ],
)
def test_each_template_family_reads_the_calls_its_constraint_writes(
    template: str, written: str
) -> None:
    fmt = format_for(template)
    tools = checked_tools([("get_weather", None, WEATHER, None)])
    constraint = fmt.constraint(use(tools, ToolChoice.AUTO, None, True))
    assert constraint is not None
    [tagged] = constraint.calls
    assert tagged.begin + '{"city": "Oslo"}' + tagged.end == written
    assert tagged.begin.startswith(constraint.triggers[0])
    reader = ReplyReader(fmt, lambda: "call_9")
    assert reader.feed("Sure. " + written)[:2] == [
        TextDelta("Sure."),
        CallOpened(0, "call_9", "get_weather"),
    ]
    _, reply = reader.finish()
    assert [(c.name, c.arguments) for c in reply.calls] == [("get_weather", '{"city": "Oslo"}')]
