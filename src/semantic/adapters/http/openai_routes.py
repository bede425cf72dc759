"""OpenAI-compatible endpoints: /v1/chat/completions, /v1/completions, /v1/models."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from litestar import Controller, Request, post, route
from litestar.datastructures import State

from semantic.adapters.http.common import (
    GET_AND_HEAD,
    result_of,
    services,
    sse,
    sse_data,
    start_chat,
    start_plain,
)
from semantic.adapters.http.errors import body_for, problem_for
from semantic.adapters.http.identity import identity
from semantic.adapters.http.openai_schemas import (
    ChatCompletionRequest,
    ChatMessageIn,
    CompletionRequest,
    SamplingFields,
)
from semantic.adapters.http.openai_tools import (
    call_entry,
    history_calls,
    new_call_id,
    openai_tool_use,
    reply_delta,
)
from semantic.adapters.http.retention_hints import cache_key_agent, keep_started, openai_hints
from semantic.adapters.http.state import Services
from semantic.adapters.http.tool_translate import (
    reply_shape,
    response_schema,
)
from semantic.adapters.http.translate import (
    OPENAI_FINISH,
    chat,
    check_model,
    joined_text,
    must_default,
    sampling,
    stop_strings,
)
from semantic.application.chat.call_memory import CallMemory
from semantic.application.chat.generation import (
    GenerationHandle,
    GenerationInput,
    GenerationResult,
    TextDelta,
)
from semantic.application.chat.tool_replies import Reply, ReplyReader
from semantic.domain.chat import ChatMessage, check_tool_answers
from semantic.domain.constraints import OutputConstraint
from semantic.domain.errors import InvalidRequestError, SemanticError
from semantic.ports.tokenizer import Tokenizer

COMPLETION_DEFAULT_MAX_TOKENS = 16
"""OpenAI's default for legacy completions (chat replies run to the end of the turn)."""

Chunk = Callable[[dict[str, Any] | None, str | None], dict[str, Any]]


class OpenAIController(Controller):
    path = "/v1"
    tags = ("OpenAI-compatible",)

    @route("/models", http_method=GET_AND_HEAD)
    async def models(self, state: State) -> dict[str, Any]:
        found = services(state)
        return {"object": "list", "data": [_model_entry(found.model_id)]}

    @route("/models/{model_id:str}", http_method=GET_AND_HEAD)
    async def model(self, model_id: str, state: State) -> dict[str, Any]:
        found = services(state)
        check_model(model_id, found.model_id)
        return {**_model_entry(found.model_id), "runtime": dict(found.runtime)}

    @post("/chat/completions", status_code=200)
    async def chat_completions(
        self, request: Request[Any, Any, Any], data: ChatCompletionRequest, state: State
    ) -> Any:
        """Chat completion; ``X-Agent-Id``/``X-Namespace``/``X-Priority`` headers apply."""
        found = services(state)
        _check_common(data, found)
        _check_chat_only(data)
        if data.max_tokens is not None and data.max_completion_tokens is not None:
            raise InvalidRequestError(
                "give max_tokens or max_completion_tokens, not both", param="max_tokens"
            )
        messages = [_chat_message(message) for message in data.messages]
        if not messages:
            raise InvalidRequestError("messages must not be empty", param="messages")
        check_tool_answers(messages)
        use = openai_tool_use(data.tools, data.tool_choice, data.parallel_tool_calls)
        shape = reply_shape(found.tokenizer, use, response_schema(data.response_format))
        namespace = identity(request).namespace
        hints = openai_hints(request, data.prompt_cache_retention)
        messages = await found.calls.restore(namespace, messages)
        tools = use.tools if use else ()
        prompt = found.tokenizer.render_chat(messages, scope=namespace, tools=tools)
        newer = data.max_completion_tokens  # OpenAI's newer name wins where given
        limit = data.max_tokens if newer is None else newer
        generation = _input(request, data, prompt, limit, shape.constraint)
        handle = await start_chat(found, generation, messages, use)
        await keep_started(found, handle, namespace, generation.agent_id, hints)
        reply = ReplyBodies("chatcmpl", "chat.completion", found.model_id)
        reader = ReplyReader(shape.calls_in, new_call_id)
        kept = _Keep(found.calls, namespace)
        if data.stream:
            usage = bool(data.stream_options and data.stream_options.include_usage)
            return sse(reply.chat_chunks(handle, usage, reader, kept), handle.close)
        result = await result_of(request, handle)
        reader.feed(result.text)
        _, answer = reader.finish()
        await kept(answer)
        return reply.chat(result, answer)

    @post("/completions", status_code=200)
    async def completions(
        self, request: Request[Any, Any, Any], data: CompletionRequest, state: State
    ) -> Any:
        found = services(state)
        _check_common(data, found)
        _check_completion_only(data)
        try:
            prompt = _prompt_ids(data.prompt, found.tokenizer)
            limit = data.max_tokens
            if limit is None:  # OpenAI's default here, within the room the prompt leaves
                room = found.generation.limits.max_context - len(prompt)
                limit = min(COMPLETION_DEFAULT_MAX_TOKENS, max(1, room))
            generation = _input(request, data, prompt, limit)
            hints = openai_hints(request, data.prompt_cache_retention)
            handle = await start_plain(found, generation)
            await keep_started(found, handle, generation.namespace, generation.agent_id, hints)
        except InvalidRequestError as error:
            if error.param == "messages":  # the use case names the chat field
                error.param = "prompt"
            raise
        reply = ReplyBodies("cmpl", "text_completion", found.model_id)
        if data.stream:
            usage = bool(data.stream_options and data.stream_options.include_usage)
            return sse(reply.text_chunks(handle, usage), handle.close)
        return reply.text(await result_of(request, handle))


class ReplyBodies:
    """Response bodies of one request, in OpenAI's shapes."""

    def __init__(self, prefix: str, kind: str, model: str) -> None:
        self.id = f"{prefix}-{uuid.uuid4().hex[:24]}"
        self.kind = kind
        self.model = model
        self.created = int(time.time())

    def chat(self, result: GenerationResult, answer: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": answer.content}
        if answer.calls:
            message["content"] = answer.content or None
            message["tool_calls"] = [call_entry(call) for call in answer.calls]
        choice = {
            "index": 0,
            "message": message,
            "finish_reason": _finish(result, answer),
            "logprobs": None,
        }
        return self._body([choice], result)

    def text(self, result: GenerationResult) -> dict[str, Any]:
        choice = {
            "index": 0,
            "text": result.text,
            "logprobs": None,
            "finish_reason": OPENAI_FINISH[result.finish_reason],
        }
        return self._body([choice], result)

    async def chat_chunks(
        self,
        handle: GenerationHandle,
        usage: bool,
        reader: ReplyReader,
        kept: Callable[[Reply], Awaitable[None]],
    ) -> AsyncIterator[str]:
        """Text and calls as they form (``ReplyReader``), each call as OpenAI streams one:
        id, type and name in its first delta, then its arguments in pieces."""

        def chunk(delta: dict[str, Any] | None, finish: str | None = None) -> str:
            body = {"index": 0, "delta": delta or {}, "finish_reason": finish, "logprobs": None}
            return self._chunk([body])

        yield chunk({"role": "assistant", "content": ""})
        try:
            async for event in handle.events():
                if isinstance(event, TextDelta):
                    for piece in reader.feed(event.text):
                        yield chunk(reply_delta(piece))
                elif isinstance(event, GenerationResult):
                    rest, answer = reader.finish()
                    for piece in rest:
                        yield chunk(reply_delta(piece))
                    await kept(answer)
                    yield chunk(None, _finish(event, answer))
                    if usage:
                        yield self._chunk([], _usage(event))
        except SemanticError as error:  # typed as the same error outside a stream would be
            yield sse_data(body_for("/v1/chat/completions", problem_for(error)))
        yield "data: [DONE]\n\n"

    async def text_chunks(self, handle: GenerationHandle, usage: bool) -> AsyncIterator[str]:
        def chunk(delta: dict[str, Any] | None, finish: str | None) -> dict[str, Any]:
            return {
                "index": 0,
                "text": (delta or {}).get("text", ""),
                "finish_reason": finish,
                "logprobs": None,
            }

        async for line in self._stream(handle, usage, chunk, lambda t: {"text": t}):
            yield line

    async def _stream(
        self,
        handle: GenerationHandle,
        usage: bool,
        chunk: Chunk,
        delta: Callable[[str], dict[str, Any]],
    ) -> AsyncIterator[str]:
        try:
            async for event in handle.events():
                if isinstance(event, TextDelta):
                    yield self._chunk([chunk(delta(event.text), None)])
                elif isinstance(event, GenerationResult):
                    yield self._chunk([chunk(None, OPENAI_FINISH[event.finish_reason])])
                    if usage:
                        yield self._chunk([], _usage(event))
        except SemanticError as error:  # typed as the same error outside a stream would be
            yield sse_data(body_for("/v1/chat/completions", problem_for(error)))
        yield "data: [DONE]\n\n"

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> str:
        body: dict[str, Any] = {
            "id": self.id,
            "object": f"{self.kind}.chunk" if self.kind == "chat.completion" else self.kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            body["usage"] = usage
        return sse_data(body)

    def _body(self, choices: list[dict[str, Any]], result: GenerationResult) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": self.kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": _usage(result),
        }


_SERVED_SINCE = int(time.time())
"""A model's ``created``: when this process started serving it (as vLLM answers)."""


def _model_entry(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": _SERVED_SINCE, "owned_by": "semantic"}


def _finish(result: GenerationResult, answer: Reply) -> str:
    """``tool_calls`` for whole calls; a reply cut inside one ends as it was cut."""
    whole = answer.calls and not answer.cut_in_a_call
    return "tool_calls" if whole else OPENAI_FINISH[result.finish_reason]


class _Keep:
    """Keeps a reply's calls as generated, for their round trip (``CallMemory``)."""

    def __init__(self, memory: CallMemory, namespace: str) -> None:
        self._memory = memory
        self._namespace = namespace

    async def __call__(self, answer: Reply) -> None:
        await self._memory.remember(self._namespace, answer)


def _usage(result: GenerationResult) -> dict[str, Any]:
    usage = result.usage
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def _check_common(data: SamplingFields, found: Services) -> None:
    check_model(data.model, found.model_id)
    must_default(data.n, 1, "n")
    must_default(data.presence_penalty, 0, "presence_penalty")
    must_default(data.frequency_penalty, 0, "frequency_penalty")
    if data.logit_bias and any(data.logit_bias.values()):
        raise InvalidRequestError("logit_bias is not supported", param="logit_bias")
    if data.stream_options is not None and not data.stream:
        raise InvalidRequestError("stream_options needs stream=true", param="stream_options")


def _check_completion_only(data: CompletionRequest) -> None:
    must_default(data.logprobs, None, "logprobs")
    must_default(data.echo, False, "echo")
    must_default(data.best_of, 1, "best_of")
    must_default(data.suffix or None, None, "suffix")


def _check_chat_only(data: ChatCompletionRequest) -> None:
    """Chat fields this server has no use for are fine at their neutral values only."""
    must_default(data.logprobs, False, "logprobs")
    must_default(data.prediction, None, "prediction")
    if data.functions:
        raise InvalidRequestError("functions are not supported; use tools", param="functions")
    if data.max_completion_tokens is not None and data.max_completion_tokens < 1:
        message = f"max_completion_tokens must be at least 1, got {data.max_completion_tokens}"
        raise InvalidRequestError(message, param="max_completion_tokens")
    if data.function_call not in (None, "none", "auto"):
        message = "function_call is not supported; use tools and tool_choice"
        raise InvalidRequestError(message, param="function_call")
    must_default(data.top_logprobs, 0, "top_logprobs")
    for unused, name in (
        (data.reasoning_effort, "reasoning_effort"),
        (data.audio, "audio"),
        (data.verbosity, "verbosity"),
        (data.web_search_options, "web_search_options"),
    ):
        must_default(unused, None, name)
    if data.modalities is not None and data.modalities != ["text"]:
        raise InvalidRequestError("only the 'text' modality is supported", param="modalities")


def _chat_message(message: ChatMessageIn) -> ChatMessage:
    """A history message as the model reads it. A reply sent back as OpenAI's SDKs dump it
    carries null tool and audio fields; only a non-empty one asks for what is missing."""
    if message.role not in ("system", "developer", "user", "assistant", "tool"):
        raise InvalidRequestError(
            f"message role {message.role!r} is not supported", param="messages"
        )
    if message.function_call:
        raise InvalidRequestError(
            "messages with function_call are not supported; use tool_calls", param="messages"
        )
    if message.tool_calls and message.role != "assistant":
        raise InvalidRequestError("only assistant messages have tool_calls", param="messages")
    if message.audio is not None:
        raise InvalidRequestError("messages with audio are not supported", param="messages")
    if (message.role == "tool") != (message.tool_call_id is not None):
        raise InvalidRequestError(
            "a tool message needs its tool_call_id, and only a tool message has one",
            param="messages",
        )
    text = joined_text(message.content, "content part", refusal_ok=message.role == "assistant")
    if message.role == "tool":
        return ChatMessage("tool", text, tool_call_id=message.tool_call_id)
    calls = history_calls(message.tool_calls or [])
    return dataclasses.replace(chat(message.role, text or message.refusal or ""), tool_calls=calls)


def _input(
    request: Request[Any, Any, Any],
    data: SamplingFields,
    prompt: list[int],
    max_tokens: int | None,
    constraint: OutputConstraint | None = None,
) -> GenerationInput:
    who = identity(request)
    return GenerationInput(
        tuple(prompt),
        who.namespace,
        who.agent_id or cache_key_agent(data.prompt_cache_key),
        max_tokens,
        sampling(data.temperature, data.top_p, data.seed, data.top_k),
        stop_strings(data.stop),
        who.priority,
        constraint,
    )


def _prompt_ids(prompt: str | list[Any], tokenizer: Tokenizer) -> list[int]:
    """The prompt's token ids: from one text (alone or in a list), or given as ids, as
    OpenAI's API allows (a list of ids, or a list holding one)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequestError("prompt must not be empty", param="prompt")
        return tokenizer.encode(prompt)
    if not prompt:
        raise InvalidRequestError("prompt must not be empty", param="prompt")
    if all(isinstance(p, str | list) for p in prompt):
        raise InvalidRequestError("exactly one prompt per request is supported", param="prompt")
    if not all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        raise InvalidRequestError(
            "prompt must be a string, or token ids (a list of integers)", param="prompt"
        )
    outside = next((p for p in prompt if not 0 <= p < tokenizer.vocab_size), None)
    if outside is not None:
        raise InvalidRequestError(
            f"token id {outside} is outside the vocabulary (0 to {tokenizer.vocab_size - 1})",
            param="prompt",
        )
    return list(prompt)
