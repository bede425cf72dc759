"""Responses input items as the transcript's messages, and the kinds refused by index."""

from __future__ import annotations

import json

import pytest

from semantic.adapters.http.responses_items import input_items, item_messages
from semantic.domain.errors import InvalidRequestError


def test_calls_join_the_assistant_message_before_them() -> None:
    items = input_items(
        [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"a": 1}'},
            {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ]
    )
    messages = item_messages(items)
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool"]
    assert [c["id"] for c in json.loads(messages[2].tool_calls or "[]")] == ["c1", "c2"]
    assert messages[3].tool_call_id == "c1"
    assert messages[3].content == "sunny"
    assert all(item["id"] for item in items)


@pytest.mark.parametrize(
    ("item", "named"),
    [
        ({"type": "computer_call", "id": "cu_1"}, "input[1]: items of type 'computer_call'"),
        ({"type": "reasoning", "encrypted_content": "x"}, "input[1]: items of type 'reasoning'"),
        (
            {"role": "user", "content": [{"type": "input_file", "file_id": "f"}]},
            "input[1].content[0]: parts of type 'input_file'",
        ),
    ],
)
def test_kinds_not_served_are_refused_by_index(item: dict[str, object], named: str) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        input_items([{"role": "user", "content": "Hi"}, item])
    assert refused.value.param == "input"
    assert str(refused.value).startswith(named)
