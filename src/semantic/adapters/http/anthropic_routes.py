"""Anthropic-compatible endpoints: /v1/messages and /v1/messages/count_tokens."""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from litestar import Controller, Request, post
from litestar.datastructures import State

from semantic.adapters.http.anthropic_context import applied_edits, context_edit
from semantic.adapters.http.anthropic_schemas import (
    AnthropicMessage,
    CountTokensRequest,
    MessagesRequest,
    PlainChat,
    TextBlock,
)
from semantic.adapters.http.anthropic_tools import (
    anthropic_tool_use,
    history_message,
    new_tool_use_id,
    tool_use_block,
)
from semantic.adapters.http.common import (
    result_of,
    services,
    sse,
    sse_data,
    start_chat,
)
from semantic.adapters.http.errors import body_for, problem_for
from semantic.adapters.http.identity import identity
from semantic.adapters.http.retention_hints import anthropic_hints, keep_started
from semantic.adapters.http.state import Services
from semantic.adapters.http.tool_translate import (
    reply_shape,
)
from semantic.adapters.http.translate import (
    ANTHROPIC_MAX_TEMPERATURE,
    ANTHROPIC_STOP,
    chat,
    check_model,
    joined_text,
    sampling,
    stop_strings,
)
from semantic.application.chat.context_edits import edited
from semantic.application.chat.generation import (
    GenerationHandle,
    GenerationInput,
    GenerationResult,
    TextDelta,
)
from semantic.application.chat.tool_replies import CallOpened, Reply, ReplyEvent, ReplyReader
from semantic.domain.chat import ChatMessage, check_tool_answers
from semantic.domain.errors import InvalidRequestError, SemanticError
from semantic.domain.tools import Tool


class AnthropicController(Controller):
    path = "/v1/messages"
    tags = ("Anthropic-compatible",)

    @post("/", status_code=200)
    async def messages(
        self, request: Request[Any, Any, Any], data: MessagesRequest, state: State
    ) -> Any:
        """Messages; ``X-Agent-Id``/``X-Namespace``/``X-Priority`` headers apply."""
        found = services(state)
        check_model(data.model, found.model_id)
        _check_plain_chat(data)
        who = identity(request)
        hints = anthropic_hints(request, data)
        use = anthropic_tool_use(data.tools, data.tool_choice)
        shape = reply_shape(found.tokenizer, use)
        tools = use.tools if use else ()
        chat, prompt, prefill, context = await _prompt(found, data, who.namespace, tools)
        generation = GenerationInput(
            tuple(prompt),
            who.namespace,
            who.agent_id,
            data.max_tokens,
            sampling(
                data.temperature,
                data.top_p,
                None,
                data.top_k,
                max_temperature=ANTHROPIC_MAX_TEMPERATURE,
            ),
            stop_strings(data.stop_sequences, "stop_sequences"),
            who.priority,
            None if prefill else shape.constraint,
        )
        handle = await start_chat(found, generation, chat, use)
        await keep_started(found, handle, who.namespace, who.agent_id, hints)
        message_id = f"msg_{uuid.uuid4().hex[:24]}"
        reader = ReplyReader(None if prefill else shape.calls_in, new_tool_use_id)
        keep = functools.partial(found.calls.remember, who.namespace)
        if data.stream:
            events = message_events(
                handle, message_id, found.model_id, reader, keep, context=context
            )
            return sse(events, handle.close)
        result = await result_of(request, handle)
        reader.feed(result.text)
        _, answer = reader.finish()
        await keep(answer)
        return {**message_body(message_id, found.model_id, result, answer), **context}

    @post("/count_tokens", status_code=200)
    async def count_tokens(
        self, request: Request[Any, Any, Any], data: CountTokensRequest, state: State
    ) -> dict[str, Any]:
        """With ``context_management``, the count after its edit, and the count before it
        (``original_input_tokens``), as Anthropic's beta reports them."""
        found = services(state)
        check_model(data.model, found.model_id)
        _check_plain_chat(data)
        namespace = identity(request).namespace
        use = anthropic_tool_use(data.tools, data.tool_choice)
        _, prompt, _, context = await _prompt(found, data, namespace, use.tools if use else ())
        counted: dict[str, Any] = {"input_tokens": len(prompt)}
        if context:
            edits = context["context_management"]["applied_edits"]
            cleared = sum(edit["cleared_input_tokens"] for edit in edits)
            counted["context_management"] = {"original_input_tokens": len(prompt) + cleared}
        return counted


async def _prompt(
    found: Services,
    data: MessagesRequest | CountTokensRequest,
    namespace: str,
    tools: Sequence[Tool],
) -> tuple[list[ChatMessage], list[int], bool, dict[str, Any]]:
    """The conversation as rendered (calls this server generated as they were written:
    ``CallMemory``), its prompt, whether it continues a prefilled reply, and the
    ``context_management`` to report: the edit asked for, applied where it triggers (on
    the messages as sent, before their calls are restored)."""
    edit = context_edit(data.context_management)
    chat, prefill = _conversation(data.system, data.messages)

    async def rendered(messages: Sequence[ChatMessage]) -> tuple[list[ChatMessage], list[int]]:
        restored = await found.calls.restore(namespace, messages)
        prompt = found.tokenizer.render_chat(
            restored, scope=namespace, continue_final=prefill, tools=tools
        )
        return restored, prompt

    async def measure(messages: Sequence[ChatMessage]) -> int:
        return len((await rendered(messages))[1])

    applied = None
    if edit is not None:
        tokens = found.tokenizer

        def count(text: str) -> int:
            return len(tokens.encode(text)) if text else 0

        chat, applied = await edited(chat, edit, measure, count)
    restored, prompt = await rendered(chat)
    return restored, prompt, prefill, applied_edits(edit, applied)


def _check_plain_chat(data: PlainChat) -> None:
    if data.thinking is not None and data.thinking.get("type") != "disabled":
        raise InvalidRequestError("extended thinking is not supported", param="thinking")


def _conversation(
    system: str | list[TextBlock] | None, messages: list[AnthropicMessage]
) -> tuple[list[ChatMessage], bool]:
    """The conversation, and whether its final assistant message is a prefill: the reply
    continues it (Anthropic's behaviour), so its turn is left open."""
    chat = _chat(system, messages)
    check_tool_answers(chat)
    last = chat[-1]
    prefill = last.content if last.role == "assistant" and not last.tool_calls else None
    if last.role == "assistant" and last.tool_calls:
        raise InvalidRequestError(
            "the final assistant message calls tools: answer them with tool_result blocks "
            "in a user message",
            param="messages",
        )
    if prefill is not None and prefill != prefill.rstrip():
        raise InvalidRequestError(
            "final assistant content cannot end with trailing whitespace", param="messages"
        )
    if prefill == "":  # nothing to continue: a plain new turn
        chat.pop()
    if all(message.role == "system" for message in chat):  # the empty prefill was all
        raise InvalidRequestError("messages must hold a user message", param="messages")
    return chat, bool(prefill)


def _chat(
    system: str | list[TextBlock] | None, messages: list[AnthropicMessage]
) -> list[ChatMessage]:
    out = [ChatMessage("system", joined_text(system, "content block"))] if system else []
    for message in messages:
        if message.role not in ("user", "assistant"):
            raise InvalidRequestError(
                f"message role {message.role!r} is not supported", param="messages"
            )
        if isinstance(message.content, list) and any(
            b.type in ("tool_use", "tool_result") for b in message.content
        ):
            out.extend(history_message(message.role, message.content))
            continue
        final_prefill = message is messages[-1] and message.role == "assistant"
        content = message.content or "" if final_prefill else message.content  # may be empty
        out.append(chat(message.role, joined_text(content, "content block")))
    if not messages:
        raise InvalidRequestError("messages must not be empty", param="messages")
    return out


def _usage(result: GenerationResult | None, prompt_tokens: int, cached: int) -> dict[str, int]:
    return {
        "input_tokens": prompt_tokens - cached,
        "output_tokens": result.usage.completion_tokens if result else 0,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def _stop(result: GenerationResult, answer: Reply) -> str:
    """``tool_use`` for whole calls; a reply cut inside one ends as it was cut."""
    whole = answer.calls and not answer.cut_in_a_call
    return "tool_use" if whole else ANTHROPIC_STOP[result.finish_reason]


def message_body(
    message_id: str, model: str, result: GenerationResult, answer: Reply
) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if answer.content or not answer.calls:
        content.append({"type": "text", "text": answer.content})
    content.extend(tool_use_block(call) for call in answer.calls)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _stop(result, answer),
        "stop_sequence": result.stop_string,
        "usage": _usage(result, result.usage.prompt_tokens, result.usage.cached_tokens),
    }


class _Blocks:
    """A streamed message's content blocks: the text block opens with the first text (at
    once where the reply cannot call a tool, as before tools), the calls' blocks after it."""

    def __init__(self) -> None:
        self.index = 0
        self.text_open = False
        self.call_at: int | None = None
        """The index of the call block open now."""

    def open_text(self) -> str:
        self.text_open = True
        block = {"type": "content_block_start", "index": 0, "content_block": _EMPTY_TEXT}
        return sse_data(block, "content_block_start")

    def text(self, text: str) -> list[str]:
        opening = [] if self.text_open or not text else [self.open_text()]
        if not text:
            return opening
        delta = {"type": "text_delta", "text": text}
        body = {"type": "content_block_delta", "index": 0, "delta": delta}
        return [*opening, sse_data(body, "content_block_delta")]

    def close_text(self) -> list[str]:
        if not self.text_open:
            return []
        self.text_open = False
        self.index = 1
        return [sse_data({"type": "content_block_stop", "index": 0}, "content_block_stop")]

    def event(self, event: ReplyEvent) -> list[str]:
        """A piece of the reply as its blocks: text, a call's block opening, its input."""
        if isinstance(event, TextDelta):
            return self.text(event.text)
        if isinstance(event, CallOpened):
            lines = [*self.close_text(), *self.close_call()]
            self.call_at, self.index = self.index, self.index + 1
            block = {"type": "tool_use", "id": event.id, "name": event.name, "input": {}}
            start = {"type": "content_block_start", "index": self.call_at, "content_block": block}
            return [*lines, sse_data(start, "content_block_start")]
        delta = {"type": "input_json_delta", "partial_json": event.text}
        body = {"type": "content_block_delta", "index": self.call_at, "delta": delta}
        return [sse_data(body, "content_block_delta")]

    def close_call(self) -> list[str]:
        if self.call_at is None:
            return []
        stop = {"type": "content_block_stop", "index": self.call_at}
        self.call_at = None
        return [sse_data(stop, "content_block_stop")]


_EMPTY_TEXT = {"type": "text", "text": ""}


async def message_events(
    handle: GenerationHandle,
    message_id: str,
    model: str,
    reader: ReplyReader,
    keep: Callable[[Reply], Awaitable[None]],
    *,
    context: dict[str, Any] | None = None,
) -> AsyncIterator[str]:
    """``context``: the ``context_management`` the message ends with (edits applied)."""
    start: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": _usage(None, handle.prompt_tokens, handle.cached_tokens),
    }
    yield sse_data({"type": "message_start", "message": start}, "message_start")
    blocks = _Blocks()
    if not reader.reads_calls:
        yield blocks.open_text()
    yield sse_data({"type": "ping"}, "ping")
    try:
        async for event in handle.events():
            if isinstance(event, TextDelta):
                for piece in reader.feed(event.text):
                    for line in blocks.event(piece):
                        yield line
            elif isinstance(event, GenerationResult):
                for line in await _ending(event, blocks, reader, keep, context or {}):
                    yield line
    except SemanticError as error:  # typed as the same error outside a stream would be
        yield sse_data(body_for("/v1/messages", problem_for(error)), "error")


async def _ending(
    result: GenerationResult,
    blocks: _Blocks,
    reader: ReplyReader,
    keep: Callable[[Reply], Awaitable[None]],
    context: dict[str, Any],
) -> list[str]:
    rest, answer = reader.finish()
    await keep(answer)
    lines = [line for piece in rest for line in blocks.event(piece)]
    if not answer.calls and not blocks.text_open and blocks.index == 0:
        lines.append(blocks.open_text())  # an empty reply still has its text block
    lines += blocks.close_text() + blocks.close_call()
    done = {
        "type": "message_delta",
        "delta": {"stop_reason": _stop(result, answer), "stop_sequence": result.stop_string},
        "usage": _usage(result, result.usage.prompt_tokens, result.usage.cached_tokens),
        **context,
    }
    lines.append(sse_data(done, "message_delta"))
    lines.append(sse_data({"type": "message_stop"}, "message_stop"))
    return lines
