"""Edits that keep a conversation within the model's window: dropping its oldest turns
(OpenAI Responses' ``truncation: "auto"``) and clearing old tool results (Anthropic's
``clear_tool_uses_20250919``). Pure: which messages change and how; how many tokens that
saves is measured by whoever renders the prompt.

Both edit the *oldest* part of a history and leave the newest as it was, and both give the
same edited history when asked again with more turns appended, so the turn after an edit
starts from the cached KV of the edited prompt (ADR 0020).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from semantic.domain.cache_spec import BLOCK_TOKENS
from semantic.domain.chat import ChatMessage
from semantic.domain.errors import InvalidRequestError

DEFAULT_TRIGGER_TOKENS = 100_000
DEFAULT_KEEP = 3
CLEARED_RESULT = "[tool result cleared to save context]"
CLEARED_INPUT = "{}"
PLACEHOLDER_TOKENS = 8
"""About what ``CLEARED_RESULT`` costs in tokens."""


class Message(Protocol):
    @property
    def role(self) -> str: ...


M = TypeVar("M", bound=Message)


def turn_starts(messages: Sequence[Message]) -> list[int]:
    """Where each turn begins: at a user message (a tool's result stays in the turn of the
    call it answers)."""
    return [index for index, message in enumerate(messages) if message.role == "user"]


def replayed_drop(
    messages: Sequence[Message], trigger: int, sizes: Sequence[int], base: int
) -> int:
    """How many oldest turns an agent's ``drop_oldest_turns`` policy drops from
    ``messages`` (which end with the turn being asked): as many as if it had been applied
    to every request of the conversation as it grew (each ends before an assistant turn,
    the last is this one), dropping, whenever the prompt it gave was past ``trigger``, the
    fewest turns that bring it to half of it; never the turn being asked. The turns
    dropped then stay the same between drops, and the turns in between start from the
    cached KV of the one before. ``sizes``: each message's tokens; ``base``: the rest of
    the prompt (the template's own, the tools' listing)."""
    starts = turn_starts(messages)
    total = list(itertools.accumulate(sizes, initial=base))
    kept = [0 if m.role == "system" else size for m, size in zip(messages, sizes, strict=True)]
    gone = list(itertools.accumulate(kept, initial=0))
    dropped = 0
    for end in [i for i, m in enumerate(messages) if m.role == "assistant"] + [len(messages)]:
        present = [start for start in starts if start < end]

        def prompt(turns: int, end: int = end, present: list[int] = present) -> int:
            return total[end] - (gone[present[turns]] if turns else 0)

        if dropped < len(present) - 1 and prompt(dropped) >= trigger:
            turns = dropped + 1
            while turns < len(present) - 1 and prompt(turns) > trigger // 2:
                turns += 1
            dropped = turns
    return dropped


def without_oldest_turns(messages: Sequence[M], turns: int) -> list[M]:
    """``messages`` less their first ``turns`` turns (system messages are kept)."""
    starts = turn_starts(messages)
    if turns <= 0 or not starts:
        return list(messages)
    cut = starts[turns] if turns < len(starts) else len(messages)
    return [m for i, m in enumerate(messages) if i >= cut or m.role == "system"]


DROP_OLDEST_TURNS = "drop_oldest_turns"
CLEAR_TOOL_RESULTS = "clear_tool_results"


@dataclass(frozen=True, slots=True)
class ContextPolicy:
    """An agent's own rule for a conversation past ``trigger_tokens``: drop its oldest
    turns (to half the trigger), or clear all but its last ``keep`` tool results. Applied
    on every turn as if on every request before it (``replayed_drop``,
    ``replayed_count``), so the edit moves in steps and the turns between stay cached.
    The system prompt is never edited; the stored transcript keeps everything."""

    edit: str
    trigger_tokens: int
    keep: int = DEFAULT_KEEP

    def __post_init__(self) -> None:
        if self.edit not in (DROP_OLDEST_TURNS, CLEAR_TOOL_RESULTS):
            raise InvalidRequestError(
                f"context.edit must be {DROP_OLDEST_TURNS!r} or {CLEAR_TOOL_RESULTS!r}, "
                f"got {self.edit!r}",
                param="context",
            )
        if self.trigger_tokens < BLOCK_TOKENS:
            raise InvalidRequestError(
                f"context.trigger_tokens must be at least {BLOCK_TOKENS} (one KV block)",
                param="context",
            )
        if self.keep < 0:
            raise InvalidRequestError("context.keep must not be negative", param="context")

    def to_json(self) -> str:
        return json.dumps(
            {"edit": self.edit, "trigger_tokens": self.trigger_tokens, "keep": self.keep}
        )

    @classmethod
    def from_json(cls, text: str) -> ContextPolicy:
        stored = json.loads(text)
        return cls(str(stored["edit"]), int(stored["trigger_tokens"]), int(stored["keep"]))

    @property
    def clearing(self) -> ClearToolUses | None:
        if self.edit != CLEAR_TOOL_RESULTS:
            return None
        return ClearToolUses(trigger_tokens=self.trigger_tokens, keep=self.keep)


@dataclass(frozen=True, slots=True)
class ClearToolUses:
    """Anthropic's ``clear_tool_uses_20250919`` edit, its defaults as documented: at
    100,000 input tokens, keep the last 3 tool uses, clear the results of the older ones."""

    trigger_tokens: int | None = DEFAULT_TRIGGER_TOKENS
    trigger_uses: int | None = None
    """The edit applies from this many tool uses on (instead of ``trigger_tokens``)."""
    keep: int = DEFAULT_KEEP
    clear_at_least: int = 0
    """Tokens an application must save, else the history is left as it was."""
    exclude: frozenset[str] = frozenset()
    clear_inputs: bool | frozenset[str] = False
    """Also clear the calls' arguments: of every tool, or of the tools named."""

    def __post_init__(self) -> None:
        for name in ("trigger_tokens", "trigger_uses"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InvalidRequestError(f"{name} must be at least 1", param="context_management")
        if self.keep < 0 or self.clear_at_least < 0:
            raise InvalidRequestError(
                "keep and clear_at_least must not be negative", param="context_management"
            )

    def clearing_inputs_of(self, tool: str) -> bool:
        inputs = self.clear_inputs
        return inputs if isinstance(inputs, bool) else tool in inputs


def clear_tool_uses(
    messages: Sequence[ChatMessage],
    edit: ClearToolUses,
    count: int | None = None,
    uses: Sequence[str] | None = None,
) -> tuple[list[ChatMessage], int]:
    """``messages`` with their oldest ``count`` clearable tool uses cleared (their results,
    and their arguments where asked; default: all but the last ``edit.keep``), and how many
    that was. Uses of an excluded tool are never cleared and do not count. ``uses``: the
    clearable calls' ids where ``messages`` do not show their calls (a reply kept as the
    text it was generated as)."""
    uses = clearable_uses(messages, edit) if uses is None else uses
    count = max(0, len(uses) - edit.keep) if count is None else min(count, len(uses))
    cleared = set(uses[:count])
    return [_cleared(message, cleared, edit) for message in messages], count


def replayed_count(
    messages: Sequence[ChatMessage], edit: ClearToolUses, sizes: Sequence[int], base: int
) -> int:
    """How many of the oldest clearable uses ``edit`` clears: as many as if it had been
    applied to every request of this conversation as it grew (each ends just before an
    assistant turn, and the last is this one), clearing all but ``keep`` whenever the
    prompt it gave was past the trigger. So a growing conversation clears in steps and
    keeps the same uses cleared between them, and the turns in between start from the
    cached KV of the one before. ``sizes``: each message's tokens, and ``base`` the rest
    of the prompt, each fixed once its messages are (an earlier request's decision must
    not change as the conversation grows)."""
    uses = clearable_uses(messages, edit)
    results = {m.tool_call_id: i for i, m in enumerate(messages) if m.role == "tool"}
    answered_at = sorted(results.get(call_id, len(messages)) for call_id in uses)
    saved = list(itertools.accumulate(_savings(uses, results, sizes), initial=0))
    total = list(itertools.accumulate(sizes, initial=base))
    count = 0
    for end in [i for i, m in enumerate(messages) if m.role == "assistant"] + [len(messages)]:
        answered = bisect.bisect_left(answered_at, end)
        if _past(edit, total[end] - saved[count], answered - count):
            wanted = max(count, answered - edit.keep)
            if saved[wanted] - saved[count] >= max(edit.clear_at_least, 1):
                count = wanted
    return count


def _past(edit: ClearToolUses, prompt: int, uncleared: int) -> bool:
    if edit.trigger_uses is not None:
        return uncleared >= edit.trigger_uses
    return edit.trigger_tokens is not None and prompt >= edit.trigger_tokens


def _savings(
    uses: Sequence[str], results: dict[str | None, int], sizes: Sequence[int]
) -> list[int]:
    """Roughly what clearing each use saves: its result's tokens (the placeholder's few
    aside); the arguments', where those are cleared too, are not counted."""
    return [
        max(0, sizes[results[call_id]] - PLACEHOLDER_TOKENS) if call_id in results else 0
        for call_id in uses
    ]


def clearable_uses(messages: Sequence[ChatMessage], edit: ClearToolUses) -> list[str]:
    """The ids of the calls an edit may clear, oldest first."""
    return [c.id for m in messages for c in m.tool_calls if c.name not in edit.exclude]


def _cleared(message: ChatMessage, cleared: set[str], edit: ClearToolUses) -> ChatMessage:
    if message.role == "tool" and message.tool_call_id in cleared:
        return dataclasses.replace(message, content=CLEARED_RESULT)
    calls = tuple(
        dataclasses.replace(c, arguments=CLEARED_INPUT)
        if c.id in cleared and edit.clearing_inputs_of(c.name)
        else c
        for c in message.tool_calls
    )
    return (
        dataclasses.replace(message, tool_calls=calls) if calls != message.tool_calls else message
    )
