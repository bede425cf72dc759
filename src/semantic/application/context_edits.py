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
    replayed_count,
    replayed_drop,
    without_oldest_turns,
)

Measure = Callable[[Sequence[ChatMessage]], Awaitable[int]]
"""How many tokens a conversation's prompt has."""
Count = Callable[[str], int]
"""How many tokens a text has."""
MESSAGE_TOKENS = 4
"""About what a chat template adds around a message (its role, its delimiters)."""


@dataclass(frozen=True, slots=True)
class AppliedEdit:
    cleared_uses: int
    cleared_tokens: int


async def edited(
    chat: Sequence[ChatMessage], edit: ClearToolUses, measure: Measure, count: Count
) -> tuple[list[ChatMessage], AppliedEdit | None]:
    """``chat`` with ``edit`` applied as it would have been on each request of the
    conversation so far (``replayed_count``), and what it did (None: nothing cleared)."""
    before = await measure(chat)
    sizes = [_size(message, count) for message in chat]
    clear = replayed_count(chat, edit, sizes, before - sum(sizes))
    if not clear:
        return list(chat), None
    cleared, uses = clear_tool_uses(chat, edit, clear)
    return cleared, AppliedEdit(uses, before - await measure(cleared))


def policy_applied(
    chat: Sequence[ChatMessage], policy: ContextPolicy, prompt_tokens: int, count: Count
) -> list[ChatMessage]:
    """``chat`` (whose prompt has ``prompt_tokens``) as an agent's context policy edits it
    on this turn. Below the trigger nothing before it was edited either (a conversation
    only grows), so nothing is measured."""
    if prompt_tokens < policy.trigger_tokens:
        return list(chat)
    sizes = [_size(message, count) for message in chat]
    base = prompt_tokens - sum(sizes)
    clearing = policy.clearing
    if clearing is not None:
        return clear_tool_uses(chat, clearing, replayed_count(chat, clearing, sizes, base))[0]
    dropped = replayed_drop(chat, policy.trigger_tokens, sizes, base)
    return without_oldest_turns(chat, dropped)


def _size(message: ChatMessage, count: Count) -> int:
    calls = sum(count(call.name) + count(call.arguments) for call in message.tool_calls)
    return count(message.content) + calls + MESSAGE_TOKENS
