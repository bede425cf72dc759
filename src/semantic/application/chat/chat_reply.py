"""A reply as every front door starts and reads it: a refusal of its shape named by the
request's own field, then its text and calls as they form (``ReplyReader``), then its
outcome, once its calls are kept; and the wait for the whole of it. The plain front
doors' turn (``chat_turn``) and an agent's (``agents.turns``) both start theirs here
(``start_reply``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass

from semantic.application.chat.context_edits import AppliedEdit
from semantic.application.chat.generation import (
    GenerationFailedError,
    GenerationHandle,
    GenerationResult,
    TextDelta,
)
from semantic.application.chat.reply_shape import ReplyShape, named_refusal
from semantic.application.chat.tool_replies import Reply, ReplyEvent, ReplyReader
from semantic.domain.constraints import UnsupportedSchemaError
from semantic.domain.generation import LIMITS
from semantic.domain.tools import ToolUse


@dataclass(frozen=True, slots=True)
class ChatOutcome:
    """The reply's end: the generation's result and the reply as read (text, calls)."""

    result: GenerationResult
    answer: Reply


class ChatReply:
    """A started reply: its text and calls as they form, then its ``ChatOutcome``."""

    def __init__(
        self,
        handle: GenerationHandle,
        reader: ReplyReader,
        keep: Callable[[Reply], Awaitable[None]],
        applied: AppliedEdit | None,
        *,
        must_call: bool = False,
    ) -> None:
        self._handle = handle
        self._reader = reader
        self._keep = keep
        self.applied = applied
        """What the request's context edit cleared (None: nothing, or none asked)."""
        self.must_call = must_call
        """The reply is calls and no text (``tool_choice`` required or named): known
        before its first token, as OpenAI's streams open it (``content: null``)."""

    @property
    def request_id(self) -> str:
        return self._handle.request_id

    @property
    def prompt_tokens(self) -> int:
        return self._handle.prompt_tokens

    @property
    def cached_tokens(self) -> int:
        return self._handle.cached_tokens

    @property
    def reads_calls(self) -> bool:
        """Whether the reply may call tools (else all of it is text, passed on at once)."""
        return self._reader.reads_calls

    async def events(self) -> AsyncGenerator[ReplyEvent | ChatOutcome, None]:
        """The reply's pieces as they form; last its outcome, once its calls are kept."""
        async with contextlib.aclosing(self._handle.events()) as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    pieces = self._reader.feed(event.text)
                    if (pieces or event.logprobs) and not self._reader.reads_calls:
                        pieces = [event]  # all text: the delta itself, with its tokens' logprobs
                    for piece in pieces:
                        yield piece
                elif isinstance(event, GenerationResult):
                    rest, answer = self._reader.finish(cut=event.finish_reason in LIMITS)
                    for piece in rest:
                        yield piece
                    await self._keep(answer)
                    yield ChatOutcome(event, answer)

    async def outcome(self) -> ChatOutcome:
        """The whole reply, waited for."""
        async for event in self.events():
            if isinstance(event, ChatOutcome):
                return event
        raise GenerationFailedError("the request ended without a result")

    def close(self) -> None:
        """End the generation (a client gone): its blocks are freed at the next step."""
        self._handle.close()


async def nothing_kept(answer: Reply) -> None:
    """For a reply kept elsewhere (an agent's, with its transcript)."""


async def start_reply(
    start: Awaitable[GenerationHandle],
    shape: ReplyShape,
    tools: ToolUse | None,
    new_id: Callable[[], str],
    *,
    keep: Callable[[Reply], Awaitable[None]] = nothing_kept,
    applied: AppliedEdit | None = None,
) -> ChatReply:
    """The reply ``start`` queues, read in ``shape`` (its calls given ids by ``new_id``;
    ``keep``: what keeps them once whole). A schema the grammar engine refused is named by
    the request's own field (``named_refusal``)."""
    try:
        handle = await start
    except UnsupportedSchemaError as error:  # the grammar engine's, naming no field
        raise named_refusal(error, tools, shape) from None
    must_call = shape.constraint is not None and shape.constraint.require_call
    reader = ReplyReader(shape.calls_in, new_id)
    return ChatReply(handle, reader, keep, applied, must_call=must_call)
