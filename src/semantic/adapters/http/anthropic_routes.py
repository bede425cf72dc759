"""Anthropic-compatible endpoints: /v1/messages and /v1/messages/count_tokens."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from litestar import Controller, Request, post
from litestar.datastructures import State

from semantic.adapters.http.anthropic_schemas import (
    AnthropicMessage,
    CountTokensRequest,
    MessagesRequest,
    PlainChat,
    TextBlock,
)
from semantic.adapters.http.common import result_of, services, sse, sse_data, start_plain
from semantic.adapters.http.errors import body_for, problem_for
from semantic.adapters.http.identity import identity
from semantic.adapters.http.state import Services
from semantic.adapters.http.translate import (
    ANTHROPIC_MAX_TEMPERATURE,
    ANTHROPIC_STOP,
    chat,
    check_model,
    joined_text,
    sampling,
    stop_strings,
)
from semantic.application.generation import (
    GenerationHandle,
    GenerationInput,
    GenerationResult,
    TextDelta,
)
from semantic.domain.chat import ChatMessage
from semantic.domain.errors import InvalidRequestError, SemanticError


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
        prompt = _render(found, data.system, data.messages, who.namespace)
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
        )
        handle = await start_plain(found, generation)
        message_id = f"msg_{uuid.uuid4().hex[:24]}"
        if data.stream:
            return sse(_events(handle, message_id, found.model_id), handle.close)
        return _message(message_id, found.model_id, await result_of(request, handle))

    @post("/count_tokens", status_code=200)
    async def count_tokens(
        self, request: Request[Any, Any, Any], data: CountTokensRequest, state: State
    ) -> dict[str, int]:
        found = services(state)
        check_model(data.model, found.model_id)
        _check_plain_chat(data)
        prompt = _render(found, data.system, data.messages, identity(request).namespace)
        return {"input_tokens": len(prompt)}


def _check_plain_chat(data: PlainChat) -> None:
    if data.tools:
        raise InvalidRequestError(
            "tools are not supported: the model is served for plain chat", param="tools"
        )
    if data.tool_choice is not None and data.tool_choice.get("type") not in ("none", "auto"):
        raise InvalidRequestError(
            "tool_choice needs tools, which are not supported", param="tool_choice"
        )
    if data.thinking is not None and data.thinking.get("type") != "disabled":
        raise InvalidRequestError("extended thinking is not supported", param="thinking")


def _render(
    found: Services,
    system: str | list[TextBlock] | None,
    messages: list[AnthropicMessage],
    scope: str,
) -> list[int]:
    """The prompt's ids. A final assistant message is a prefill: the reply continues it
    (Anthropic's behaviour), so its turn is left open."""
    chat = _chat(system, messages)
    prefill = chat[-1].content if chat[-1].role == "assistant" else None
    if prefill is not None and prefill != prefill.rstrip():
        raise InvalidRequestError(
            "final assistant content cannot end with trailing whitespace", param="messages"
        )
    if prefill == "":  # nothing to continue: a plain new turn
        chat.pop()
    return found.tokenizer.render_chat(chat, scope=scope, continue_final=bool(prefill))


def _chat(
    system: str | list[TextBlock] | None, messages: list[AnthropicMessage]
) -> list[ChatMessage]:
    out = [ChatMessage("system", joined_text(system, "content block"))] if system else []
    for message in messages:
        if message.role not in ("user", "assistant"):
            raise InvalidRequestError(
                f"message role {message.role!r} is not supported", param="messages"
            )
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


def _message(message_id: str, model: str, result: GenerationResult) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": result.text}],
        "stop_reason": ANTHROPIC_STOP[result.finish_reason],
        "stop_sequence": result.stop_string,
        "usage": _usage(result, result.usage.prompt_tokens, result.usage.cached_tokens),
    }


async def _events(handle: GenerationHandle, message_id: str, model: str) -> AsyncIterator[str]:
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
    block = {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    yield sse_data(block, "content_block_start")
    yield sse_data({"type": "ping"}, "ping")
    try:
        async for event in handle.events():
            if isinstance(event, TextDelta):
                delta = {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": event.text},
                }
                yield sse_data(delta, "content_block_delta")
            elif isinstance(event, GenerationResult):
                yield sse_data({"type": "content_block_stop", "index": 0}, "content_block_stop")
                done = {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": ANTHROPIC_STOP[event.finish_reason],
                        "stop_sequence": event.stop_string,
                    },
                    "usage": _usage(event, event.usage.prompt_tokens, event.usage.cached_tokens),
                }
                yield sse_data(done, "message_delta")
                yield sse_data({"type": "message_stop"}, "message_stop")
    except SemanticError as error:  # typed as the same error outside a stream would be
        yield sse_data(body_for("/v1/messages", problem_for(error)), "error")
