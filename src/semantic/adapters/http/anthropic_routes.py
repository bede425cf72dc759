"""Anthropic-compatible endpoints: /v1/messages and /v1/messages/count_tokens."""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from litestar import Controller, Request, post
from litestar.datastructures import State

from semantic.adapters.http.anthropic_context import applied_edits, context_edit
from semantic.adapters.http.anthropic_documents import documents_as_text
from semantic.adapters.http.anthropic_schemas import (
    AnthropicMessage,
    CountTokensRequest,
    MessagesRequest,
    PlainChat,
    TextBlock,
)
from semantic.adapters.http.anthropic_threads import hold, whole_request
from semantic.adapters.http.anthropic_tools import (
    anthropic_tool_use,
    history_message,
    new_tool_use_id,
    tool_use_block,
)
from semantic.adapters.http.common import result_of, services, sse, sse_data
from semantic.adapters.http.errors import (
    ThreadsNotServedError,
    body_for,
    in_own_words,
    problem_for,
)
from semantic.adapters.http.identity import identity
from semantic.adapters.http.retention_hints import anthropic_hints
from semantic.adapters.http.strict_body import StrictBody
from semantic.adapters.http.tool_translate import output_config_schema
from semantic.adapters.http.translate import (
    ANTHROPIC_MAX_TEMPERATURE,
    ANTHROPIC_STOP,
    chat,
    check_model,
    joined_text,
    sampling,
    stop_strings,
)
from semantic.application.chat.chat_reply import ChatOutcome, ChatReply
from semantic.application.chat.chat_turn import ChatAsk
from semantic.application.chat.generation import (
    GenerationResult,
    TextDelta,
)
from semantic.application.chat.tool_replies import CallOpened, Reply, ReplyEvent
from semantic.domain.chat import ChatMessage, check_tool_answers
from semantic.domain.constraints import UnsupportedSchemaError
from semantic.domain.errors import InvalidRequestError, SemanticError
from semantic.domain.generation import GREEDY, FinishReason, SamplingParams


class AnthropicController(Controller):
    path = "/v1/messages"
    tags = ("Anthropic-compatible",)

    @post("/", status_code=200, dto=StrictBody[MessagesRequest])
    async def messages(
        self, request: Request[Any, Any, Any], data: MessagesRequest, state: State
    ) -> Any:
        """Messages; ``X-Agent-Id``/``X-Namespace``/``X-Priority`` headers apply."""
        found = services(state)
        check_model(data.model, found.model_id)
        namespace = identity(request).namespace
        data = await whole_request(found, namespace, data)  # a thread's continuation: whole
        _check_plain_chat(data)
        ask = _ask(request, data)
        try:
            reply = await found.chats.start(ask)
        except UnsupportedSchemaError as error:  # named by OpenAI's field where it is ours
            if error.param != "response_format":
                raise
            raise in_own_words(error, "response_format", "output_config", "output_config") from None
        message_id = f"msg_{uuid.uuid4().hex[:24]}"
        context = applied_edits(ask.context_edit, reply.applied)
        keep = functools.partial(hold, found, namespace, data, message_id)
        if data.stream:
            window = found.chats.max_context
            events = message_events(
                reply, message_id, found.model_id, window, context=context, keep=keep
            )
            return sse(events, reply.close)
        outcome = await result_of(request, reply)
        body = message_body(message_id, found.model_id, outcome, found.chats.max_context)
        await keep(body["content"])
        return {**body, **context}

    @post("/count_tokens", status_code=200, dto=StrictBody[CountTokensRequest])
    async def count_tokens(
        self, request: Request[Any, Any, Any], data: CountTokensRequest, state: State
    ) -> dict[str, Any]:
        """With ``context_management``, the count after its edit, and the count before it
        (``original_input_tokens``), as Anthropic's beta reports them."""
        found = services(state)
        check_model(data.model, found.model_id)
        _check_plain_chat(data)
        if data.thread is not None:
            raise ThreadsNotServedError()
        ask = _ask(request, data)
        rendered = await found.chats.render(ask)
        prompt, context = rendered.prompt, applied_edits(ask.context_edit, rendered.applied)
        counted: dict[str, Any] = {"input_tokens": len(prompt)}
        if context:
            edits = context["context_management"]["applied_edits"]
            cleared = sum(edit["cleared_input_tokens"] for edit in edits)
            counted["context_management"] = {"original_input_tokens": len(prompt) + cleared}
        return counted


def _ask(request: Request[Any, Any, Any], data: MessagesRequest | CountTokensRequest) -> ChatAsk:
    """The request as the chat turn takes it (a count takes its prompt only)."""
    who = identity(request)
    chat, prefill = _conversation(data.system, data.messages)
    full = data if isinstance(data, MessagesRequest) else None
    return ChatAsk(
        who.namespace,
        who.agent_id,
        tuple(chat),
        tools=anthropic_tool_use(data.tools, data.tool_choice),
        json_schema=output_config_schema(data.output_config),
        continue_final=prefill,
        context_edit=context_edit(data.context_management),
        max_tokens=full.max_tokens if full else None,
        max_tokens_lowered=True,
        sampling=_sampling(full) if full else GREEDY,
        stop=stop_strings(full.stop_sequences, "stop_sequences") if full else (),
        priority=who.priority,
        retention=anthropic_hints(request, full) if full else {},
        new_call_id=new_tool_use_id,
    )


def _sampling(data: MessagesRequest) -> SamplingParams:
    return sampling(
        data.temperature, data.top_p, None, data.top_k, max_temperature=ANTHROPIC_MAX_TEMPERATURE
    )


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


_TOOL_BLOCKS = ("tool_use", "tool_result")


def _chat(
    system: str | list[TextBlock] | None, messages: list[AnthropicMessage]
) -> list[ChatMessage]:
    out = [ChatMessage("system", joined_text(system, "content block"))] if system else []
    for message in messages:
        _check_no_tool_changes(message)
        if message.role not in ("user", "assistant"):
            raise InvalidRequestError(
                f"message role {message.role!r} is not supported", param="messages"
            )
        content = message.content
        if isinstance(content, list) and message.role == "user":
            content = documents_as_text(content)
        if isinstance(content, list) and any(b.type in _TOOL_BLOCKS for b in content):
            out.extend(history_message(message.role, content))
            continue
        final_prefill = message is messages[-1] and message.role == "assistant"
        content = content or "" if final_prefill else content  # may be empty
        out.append(chat(message.role, joined_text(content, "content block")))
    if not messages:
        raise InvalidRequestError("messages must not be empty", param="messages")
    return out


def _check_no_tool_changes(message: AnthropicMessage) -> None:
    """The SDK's ``add_tools``/``remove_tools`` (the inline-tools beta) send these in a
    system message; refused by kind, not as an odd field or role."""
    content = message.content if isinstance(message.content, list) else []
    changing = next((b.type for b in content if b.type in ("tool_addition", "tool_removal")), None)
    if changing is not None:
        raise InvalidRequestError(
            f"content block type {changing!r} is not supported: tools do not change within a "
            "conversation here (the inline-tools beta); send them with the request, or start "
            "a new thread with them",
            param="messages",
        )


def _usage(result: GenerationResult | None, prompt_tokens: int, cached: int) -> dict[str, int]:
    return {
        "input_tokens": prompt_tokens - cached,
        "output_tokens": result.usage.completion_tokens if result else 0,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def _stop(result: GenerationResult, answer: Reply, window: int) -> str:
    """``tool_use`` for whole calls; a reply cut inside one ends as it was cut; a reply cut
    where prompt and reply fill the model's context, ``model_context_window_exceeded``
    (its ``max_tokens`` was lowered to that room: ``ChatAsk.max_tokens_lowered``)."""
    whole = answer.calls and not answer.cut_in_a_call
    if whole:
        return "tool_use"
    usage = result.usage
    filled = usage.prompt_tokens + usage.completion_tokens >= window
    if result.finish_reason == FinishReason.MAX_TOKENS and filled:
        return "model_context_window_exceeded"
    return ANTHROPIC_STOP[result.finish_reason]


def reply_content(answer: Reply) -> list[dict[str, Any]]:
    """The reply's content blocks: its text (an empty one where there is nothing else),
    then its calls."""
    content: list[dict[str, Any]] = []
    if answer.content or not answer.calls:
        content.append({"type": "text", "text": answer.content})
    content.extend(tool_use_block(call) for call in answer.calls)
    return content


def message_body(message_id: str, model: str, outcome: ChatOutcome, window: int) -> dict[str, Any]:
    result, answer = outcome.result, outcome.answer
    content = reply_content(answer)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _stop(result, answer, window),
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
    reply: ChatReply,
    message_id: str,
    model: str,
    window: int,
    *,
    context: dict[str, Any] | None = None,
    keep: Callable[[list[dict[str, Any]]], Awaitable[None]] | None = None,
) -> AsyncIterator[str]:
    """``window``: the model's context (``_stop``); ``context``: the
    ``context_management`` the message ends with (edits applied); ``keep``: told the
    reply's content once it is whole, before the message ends (a thread holds it)."""
    start: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": _usage(None, reply.prompt_tokens, reply.cached_tokens),
    }
    yield sse_data({"type": "message_start", "message": start}, "message_start")
    blocks = _Blocks()
    if not reply.reads_calls:
        yield blocks.open_text()
    yield sse_data({"type": "ping"}, "ping")
    try:
        async for event in reply.events():
            if isinstance(event, ChatOutcome):
                if keep is not None:
                    await keep(reply_content(event.answer))
                for line in _ending(event, blocks, window, context or {}):
                    yield line
            else:
                for line in blocks.event(event):
                    yield line
    except SemanticError as error:  # typed as the same error outside a stream would be
        yield sse_data(body_for("/v1/messages", problem_for(error)), "error")


def _ending(
    outcome: ChatOutcome, blocks: _Blocks, window: int, context: dict[str, Any]
) -> list[str]:
    result, answer = outcome.result, outcome.answer
    lines: list[str] = []
    if not answer.calls and not blocks.text_open and blocks.index == 0:
        lines.append(blocks.open_text())  # an empty reply still has its text block
    lines += blocks.close_text() + blocks.close_call()
    done = {
        "type": "message_delta",
        "delta": {
            "stop_reason": _stop(result, answer, window),
            "stop_sequence": result.stop_string,
        },
        "usage": _usage(result, result.usage.prompt_tokens, result.usage.cached_tokens),
        **context,
    }
    lines.append(sse_data(done, "message_delta"))
    lines.append(sse_data({"type": "message_stop"}, "message_stop"))
    return lines
