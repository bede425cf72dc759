"""An agent's transcript as the model reads it, and a turn's messages as it is kept.

Pure functions over ``MessageRecord``s (the rendering of calls, the check that a tool's
result answers a call, the errors of a conversation grown past the context), and the one
commit a cancelled caller cannot cut in half.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import Coroutine, Sequence
from typing import Any

from semantic.application.agents.values import INTERNAL_PREFIX, Turn
from semantic.application.chat.tool_replies import Reply
from semantic.domain.chat import ChatMessage
from semantic.domain.errors import InvalidRequestError, PromptTooLongError
from semantic.domain.tools import ToolCall
from semantic.ports.metadata_store import MessageRecord


def outgrown(error: PromptTooLongError, agent_id: str) -> PromptTooLongError:
    """A turn's request past the context, said as what the caller can do about it."""
    if error.param == "max_tokens":  # the conversation fits; the reply asked for not
        return PromptTooLongError(
            f"{error}; ask for fewer max_tokens, or leave it out to get the room left",
            param="max_tokens",
        )
    if agent_id.startswith(INTERNAL_PREFIX):  # a response's: its front door names the field
        return PromptTooLongError(
            f"the conversation has outgrown the model's context with this input ({error})",
            param="content",
        )
    return PromptTooLongError(
        f"agent {agent_id!r} has outgrown the model's context with this message "
        f"({error}); start a new agent, or delete this one",
        param="content",
    )


def new_call_id() -> str:
    """An id for a generated tool call, shaped as OpenAI's are."""
    return f"call_{uuid.uuid4().hex[:24]}"


def asked(turn: Turn, when: float) -> list[MessageRecord]:
    """The messages a turn asks, as the transcript keeps them."""
    if turn.items:
        return [dataclasses.replace(m, created_at=m.created_at or when) for m in turn.items]
    return [MessageRecord(turn.role, turn.content, when, tool_call_id=turn.tool_call_id)]


def answered(answer: Reply) -> MessageRecord:
    """The reply as the transcript keeps it: with its calls, as generated where the client
    was shown all of it (``Reply.generated``)."""
    if not answer.calls:
        return MessageRecord("assistant", answer.content, time.time())
    calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in answer.calls]
    return MessageRecord(
        "assistant", answer.content, time.time(), tool_calls=json.dumps(calls), raw=answer.generated
    )


def record_calls(record: MessageRecord) -> tuple[ToolCall, ...]:
    """A transcript message's tool calls."""
    if not record.tool_calls:
        return ()
    return tuple(
        ToolCall(c["id"], c["name"], c["arguments"]) for c in json.loads(record.tool_calls)
    )


def chat_message(record: MessageRecord) -> ChatMessage:
    """A transcript message as the model reads it: a reply with calls as it was generated."""
    if record.raw is not None:
        return ChatMessage("assistant", record.raw)
    if record.role == "tool":
        return ChatMessage("tool", record.content, tool_call_id=record.tool_call_id)
    return ChatMessage(record.role, record.content, tool_calls=record_calls(record))


def answers_history(turn: Turn) -> bool:
    """Whether the turn answers a call it does not make itself: one of the history's."""
    called = {c.id for item in turn.items for c in record_calls(item)}
    answered = {item.tool_call_id for item in turn.items if item.tool_call_id is not None}
    if turn.tool_call_id is not None:
        answered.add(turn.tool_call_id)
    return bool(answered - called)


def check_answers(history: Sequence[MessageRecord], turn: Turn) -> None:
    """A tool result answers a call of the agent's transcript (or of the turn's items
    before it)."""
    called = {c.id for m in history for c in record_calls(m)}
    if turn.tool_call_id is not None and turn.tool_call_id not in called:
        raise InvalidRequestError(
            f"tool_call_id {turn.tool_call_id!r} answers no call of this agent's replies",
            param="tool_call_id",
        )
    for index, item in enumerate(turn.items):
        called.update(c.id for c in record_calls(item))
        if item.tool_call_id is not None and item.tool_call_id not in called:
            raise InvalidRequestError(
                f"input[{index}]: call_id {item.tool_call_id!r} answers no function_call before it",
                param="input",
            )


async def whole(commit: Coroutine[Any, Any, None]) -> None:
    """Run a commit to its end even if the caller is cancelled meanwhile (its client went
    away): cancelled halfway, the database's thread could still commit after the agent's
    lock was let go, and a retry would read the history without the turn, then add it again."""
    task = asyncio.ensure_future(commit)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise
