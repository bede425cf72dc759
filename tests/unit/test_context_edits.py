"""Context edits on a history: oldest turns dropped, old tool uses cleared, and the
clearing replayed over the conversation's requests so it moves in steps (issue 48)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from semantic.adapters.http.anthropic_context import applied_edits, context_edit
from semantic.application.chat.context_edits import AppliedEdit, policy_applied
from semantic.domain.chat import ChatMessage
from semantic.domain.context_edits import (
    CLEAR_TOOL_RESULTS,
    CLEARED_INPUT,
    CLEARED_RESULT,
    DROP_OLDEST_TURNS,
    ClearToolUses,
    ContextPolicy,
    clear_tool_uses,
    replayed_count,
    replayed_drop,
    without_oldest_turns,
)
from semantic.domain.errors import InvalidRequestError
from semantic.domain.tools import ToolCall


def loop(rounds: int, tool: str = "search") -> list[ChatMessage]:
    """A system prompt, a question, then ``rounds`` calls each answered by its result."""
    out = [ChatMessage("system", "Be brief."), ChatMessage("user", "Go.")]
    for i in range(rounds):
        call = ToolCall(f"c{i}", tool, f'{{"q": {i}}}')
        out += [
            ChatMessage("assistant", "", (call,)),
            ChatMessage("tool", f"r{i}", tool_call_id=f"c{i}"),
        ]
    return out


def test_dropping_turns_keeps_system_messages_and_whole_turns() -> None:
    history = [
        ChatMessage("system", "s"),
        ChatMessage("user", "a"),
        ChatMessage("assistant", "A"),
        ChatMessage("user", "b"),
        ChatMessage("assistant", "B"),
    ]
    assert [m.content for m in without_oldest_turns(history, 1)] == ["s", "b", "B"]
    assert [m.content for m in without_oldest_turns(history, 2)] == ["s"]
    assert without_oldest_turns(history, 0) == history


def test_clearing_keeps_the_last_uses_and_excluded_tools() -> None:
    history = [*loop(4), *loop(1, "memory")[2:]]
    history[-2] = ChatMessage("assistant", "", (ToolCall("m0", "memory", "{}"),))
    history[-1] = ChatMessage("tool", "kept", tool_call_id="m0")
    edit = ClearToolUses(keep=2, exclude=frozenset({"memory"}), clear_inputs=True)
    cleared, count = clear_tool_uses(history, edit)
    assert count == 2
    results = [m.content for m in cleared if m.role == "tool"]
    assert results == [CLEARED_RESULT, CLEARED_RESULT, "r2", "r3", "kept"]
    arguments = [c.arguments for m in cleared for c in m.tool_calls]
    assert arguments == [CLEARED_INPUT, CLEARED_INPUT, '{"q": 2}', '{"q": 3}', "{}"]


def sizes_of(history: list[ChatMessage]) -> list[int]:
    """Results of 300 tokens, calls of 20, the system prompt and question 50 each."""
    return [{"tool": 300, "assistant": 20}.get(m.role, 50) for m in history]


def test_replayed_clearing_moves_in_steps_as_the_conversation_grows() -> None:
    """Past 1,000 tokens the edit clears all but the last use; the uses cleared then stay
    as they are (a stable prefix, cached) until the edited prompt is past 1,000 again."""
    edit = ClearToolUses(trigger_tokens=1000, keep=1)
    counts = [replayed_count(loop(n), edit, sizes_of(loop(n)), 0) for n in range(1, 9)]
    assert counts == [0, 0, 2, 2, 4, 4, 6, 6]
    by_uses = ClearToolUses(trigger_tokens=None, trigger_uses=3, keep=1)
    counts = [replayed_count(loop(n), by_uses, sizes_of(loop(n)), 0) for n in range(1, 7)]
    assert counts == [0, 0, 2, 2, 4, 4]


def test_clear_at_least_holds_a_clearing_back_until_it_saves_that_much() -> None:
    edit = ClearToolUses(trigger_tokens=1000, keep=1, clear_at_least=600)
    assert replayed_count(loop(3), edit, sizes_of(loop(3)), 0) == 0  # 2 uses: 584 tokens
    assert replayed_count(loop(4), edit, sizes_of(loop(4)), 0) == 3


def test_context_management_is_read_and_refused_by_name() -> None:
    edit = context_edit(
        {
            "edits": [
                {
                    "type": "clear_tool_uses_20250919",
                    "trigger": {"type": "input_tokens", "value": 3000},
                    "keep": {"type": "tool_uses", "value": 2},
                    "clear_at_least": {"type": "input_tokens", "value": 500},
                    "exclude_tools": ["memory"],
                    "clear_tool_inputs": ["search"],
                }
            ]
        }
    )
    assert edit == ClearToolUses(3000, None, 2, 500, frozenset({"memory"}), frozenset({"search"}))
    assert context_edit({"edits": [{"type": "clear_tool_uses_20250919"}]}) == ClearToolUses()
    bad: list[dict[str, Any]] = [
        {"edits": [{"type": "clear_thinking_20251015"}]},
        {
            "edits": [
                {
                    "type": "clear_tool_uses_20250919",
                    "trigger": {"type": "input_tokens", "value": 100},
                }
            ]
        },
        {
            "edits": [
                {"type": "clear_tool_uses_20250919", "keep": {"type": "input_tokens", "value": 2}}
            ]
        },
        {
            "edits": [
                {"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": -1}}
            ]
        },
        {"edits": [{"type": "clear_tool_uses_20250919", "colour": "red"}]},
        {"edit": []},
    ]
    for raw in bad:
        with pytest.raises(InvalidRequestError) as refused:
            context_edit(raw)
        assert refused.value.param == "context_management", raw
    assert applied_edits(ClearToolUses(), AppliedEdit(2, 90)) == {
        "context_management": {
            "applied_edits": [
                {
                    "type": "clear_tool_uses_20250919",
                    "cleared_tool_uses": 2,
                    "cleared_input_tokens": 90,
                }
            ]
        }
    }
    assert applied_edits(None, None) == {}


def chat_turns(count: int) -> list[ChatMessage]:
    """``count`` turns of a question and an answer, then the question being asked."""
    turns = [ChatMessage("user", "q"), ChatMessage("assistant", "a")] * count
    return [ChatMessage("system", "s"), *turns, ChatMessage("user", "q")]


def test_replayed_drops_move_in_steps_and_never_drop_the_turn_asked() -> None:
    """Messages of 100 tokens, a turn 200: past 500 the oldest turns go until the prompt
    is at most 250, and stay gone; what was dropped only grows."""
    drops = [replayed_drop(chat_turns(n), 500, [100] * (2 * n + 2), 0) for n in range(8)]
    assert drops == [0, 0, 2, 2, 4, 4, 6, 6]
    history = chat_turns(7)
    kept = without_oldest_turns(history, drops[-1])
    assert [m.role for m in kept] == ["system", "user", "assistant", "user"]
    assert replayed_drop(chat_turns(3), 10_000, [100] * 8, 0) == 0


def test_a_context_policy_is_checked_and_kept_as_json() -> None:
    policy = ContextPolicy(CLEAR_TOOL_RESULTS, 1000, keep=2)
    assert ContextPolicy.from_json(policy.to_json()) == policy
    assert policy.clearing == ClearToolUses(trigger_tokens=1000, keep=2)
    assert ContextPolicy(DROP_OLDEST_TURNS, 1000).clearing is None
    for edit, trigger, keep in (
        ("forget", 1000, 3),
        (DROP_OLDEST_TURNS, 255, 3),
        (CLEAR_TOOL_RESULTS, 1000, -1),
    ):
        with pytest.raises(InvalidRequestError) as refused:
            ContextPolicy(edit, trigger, keep)
        assert refused.value.param == "context"


def test_an_agents_clearing_finds_the_calls_of_replies_kept_as_generated() -> None:
    """A reply with calls is rendered as the text it was generated as (no calls on the
    message): the view shows its calls, and the results are cleared by their ids."""
    view = [
        dataclasses.replace(m, content="page " * 300) if m.role == "tool" else m for m in loop(6)
    ]
    chat = [
        ChatMessage("assistant", "<tool_call>..</tool_call>") if m.tool_calls else m for m in view
    ]
    policy = ContextPolicy(CLEAR_TOOL_RESULTS, 1000, keep=1)

    def words(text: str) -> int:
        return len(text.split())

    def measure(shown: Sequence[ChatMessage]) -> int:
        return sum(words(m.content) + 5 for m in shown)

    edited = policy_applied(chat, view, policy, measure, words)
    results = [m.content for m in edited if m.role == "tool"]
    assert results.count(CLEARED_RESULT) >= 4
    assert results[-1] == "page " * 300
    assert [m for m in edited if m.role == "assistant"] == [
        m for m in chat if m.role == "assistant"
    ]


def test_replayed_drops_never_shrink_when_sizes_are_only_estimates() -> None:
    """Each message is counted 3 tokens short of what the template makes of it: the
    edit point still only moves forward as the conversation grows."""
    policy = ContextPolicy(DROP_OLDEST_TURNS, 600)

    def words(text: str) -> int:
        return len(text.split())

    def measure(chat: Sequence[ChatMessage]) -> int:
        return sum(words(m.content) + 8 for m in chat)

    dropped = []
    for n in range(1, 40):
        chat = [ChatMessage("system", "be brief")]
        for i in range(n):
            chat += [
                ChatMessage("user", "word " * (20 + i % 7)),
                ChatMessage("assistant", "ok " * 9),
            ]
        chat.append(ChatMessage("user", "next"))
        edited = policy_applied(chat, chat, policy, measure, words)
        dropped.append((len(chat) - len(edited)) // 2)
    assert dropped == sorted(dropped)
    assert dropped[-1] > 0
