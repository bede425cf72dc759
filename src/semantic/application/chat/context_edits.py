"""A context edit applied to a conversation about to be rendered: the domain says which
messages change (``domain.context_edits``) from the messages' sizes, which are measured
here (each message's text on its own, and the whole prompt before and after)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from semantic.domain.chat import ChatMessage
from semantic.domain.context_edits import (
    ClearToolUses,
    ContextPolicy,
    clear_tool_uses,
    clearable_uses,
    replayed_count,
    replayed_drop,
    without_oldest_turns,
)

Measure = Callable[[Sequence[ChatMessage]], Awaitable[int]]
"""How many tokens a conversation's prompt has."""
Count = Callable[[str], int]
"""How many tokens a text has."""
MESSAGE_TOKENS = 5
"""About what a chat template adds around a message (ChatML: its role, its delimiters)."""


@dataclass(frozen=True, slots=True)
class AppliedEdit:
    cleared_uses: int
    cleared_tokens: int


async def edited(
    chat: Sequence[ChatMessage], edit: ClearToolUses, measure: Measure, count: Count
) -> tuple[list[ChatMessage], AppliedEdit | None]:
    """``chat`` with ``edit`` applied as it would have been on each request of the
    conversation so far (``replayed_count``), and what it did (None: nothing cleared)."""
    sizes = [_size(message, count) for message in chat]
    opening = _opening(chat)
    base = await measure(chat[:opening]) - sum(sizes[:opening])
    clear = replayed_count(chat, edit, sizes, base)
    if not clear:
        return list(chat), None
    before = await measure(chat)
    cleared, uses = clear_tool_uses(chat, edit, clear)
    return cleared, AppliedEdit(uses, before - await measure(cleared))


def policy_applied(
    chat: Sequence[ChatMessage],
    view: Sequence[ChatMessage],
    policy: ContextPolicy,
    measure: Callable[[Sequence[ChatMessage]], int],
    count: Count,
) -> list[ChatMessage]:
    """``chat`` as an agent's context policy edits it on this turn. ``view``: the same
    messages with every reply's calls shown (``chat`` has a reply with calls as the text
    it was generated as), to find the tool uses by."""
    sizes = [_size(message, count) for message in view]
    opening = _opening(chat)
    base = measure(chat[:opening]) - sum(sizes[:opening])
    clearing = policy.clearing
    if clearing is None:
        dropped = replayed_drop(view, policy.trigger_tokens, sizes, base)
        return without_oldest_turns(list(chat), dropped)
    uses = clearable_uses(view, clearing)
    clear = replayed_count(view, clearing, sizes, base)
    return clear_tool_uses(chat, clearing, clear, uses)[0]


def _opening(chat: Sequence[ChatMessage]) -> int:
    """The first messages, which fix the rest of the prompt (``base``): the system ones
    and the first other one. A conversation's start never changes as it grows, so neither
    does an estimate made from it."""
    for index, message in enumerate(chat):
        if message.role != "system":
            return index + 1
    return len(chat)


def _size(message: ChatMessage, count: Count) -> int:
    calls = sum(count(call.name) + count(call.arguments) for call in message.tool_calls)
    return count(message.content) + calls + MESSAGE_TOKENS
