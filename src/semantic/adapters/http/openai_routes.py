"""OpenAI-compatible endpoints: /v1/chat/completions, /v1/completions, /v1/models."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from litestar import Controller, Request, post, route
from litestar.datastructures import State

from semantic.adapters.http.common import (
    GET_AND_HEAD,
    result_of,
    services,
    sse,
    sse_data,
)
from semantic.adapters.http.errors import body_for, problem_for
from semantic.adapters.http.identity import identity
from semantic.adapters.http.openai_logprobs import (
    TokenPieces,
    chat_content,
    chat_logprobs_asked,
    completion_lists,
    completion_logprobs_asked,
    remembered,
)
from semantic.adapters.http.openai_schemas import (
    ChatCompletionRequest,
    ChatMessageIn,
    CompletionRequest,
    SamplingFields,
)
from semantic.adapters.http.openai_tools import (
    call_entry,
    history_calls,
    openai_tool_use,
    reply_delta,
)
from semantic.adapters.http.retention_hints import cache_key_agent, openai_hints
from semantic.adapters.http.state import Services
from semantic.adapters.http.tool_translate import (
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
from semantic.application.chat.chat_reply import ChatOutcome, ChatReply
from semantic.application.chat.chat_turn import ChatAsk
from semantic.application.chat.generation import (
    GenerationResult,
    TextDelta,
)
from semantic.application.chat.tool_replies import Reply
from semantic.domain.chat import ChatMessage, check_tool_answers
from semantic.domain.errors import InvalidRequestError, SemanticError
from semantic.domain.generation import TokenLogprob

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

    @route("/models/{model_id:path}", http_method=GET_AND_HEAD)
    async def model(self, model_id: str, state: State) -> dict[str, Any]:
        """``model_id`` a path: a hub model is served as ``org/name``."""
        found = services(state)
        check_model(model_id.lstrip("/"), found.model_id)
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
        messages = tuple(_chat_message(message) for message in data.messages)
        if not messages:
            raise InvalidRequestError("messages must not be empty", param="messages")
        check_tool_answers(messages)
        newer = data.max_completion_tokens  # OpenAI's newer name wins where given
        ask = _ask(
            request,
            data,
            messages=messages,
            tools=openai_tool_use(data.tools, data.tool_choice, data.parallel_tool_calls),
            json_schema=response_schema(data.response_format),
            max_tokens=data.max_tokens if newer is None else newer,
            logprobs=chat_logprobs_asked(data.logprobs, data.top_logprobs),
        )
        reply = await found.chats.start(ask)
        bodies = ReplyBodies("chatcmpl", "chat.completion", found.model_id, _texts(ask, found))
        if data.stream:
            usage = bool(data.stream_options and data.stream_options.include_usage)
            return sse(bodies.chat_chunks(reply, usage), reply.close)
        return bodies.chat(await result_of(request, reply))

    @post("/completions", status_code=200)
    async def completions(
        self, request: Request[Any, Any, Any], data: CompletionRequest, state: State
    ) -> Any:
        found = services(state)
        _check_common(data, found)
        _check_completion_only(data)
        ask = _ask(
            request,
            data,
            prompt=_prompt(data.prompt),
            max_tokens=data.max_tokens,
            default_max_tokens=COMPLETION_DEFAULT_MAX_TOKENS,
            logprobs=completion_logprobs_asked(data.logprobs),
        )
        reply = await found.chats.start(ask)
        bodies = ReplyBodies("cmpl", "text_completion", found.model_id, _texts(ask, found))
        if data.stream:
            usage = bool(data.stream_options and data.stream_options.include_usage)
            return sse(bodies.text_chunks(reply, usage), reply.close)
        return bodies.text((await result_of(request, reply)).result)


class ReplyBodies:
    """Response bodies of one request, in OpenAI's shapes; ``texts``: each token's text,
    where the request asked for log-probabilities (None: it did not)."""

    def __init__(
        self, prefix: str, kind: str, model: str, texts: TokenPieces | None = None
    ) -> None:
        self.id = f"{prefix}-{uuid.uuid4().hex[:24]}"
        self.kind = kind
        self.model = model
        self.created = int(time.time())
        self.texts = texts

    def chat(self, outcome: ChatOutcome) -> dict[str, Any]:
        result, answer = outcome.result, outcome.answer
        message: dict[str, Any] = {"role": "assistant", "content": answer.content}
        if answer.calls:
            message["content"] = answer.content or None
            message["tool_calls"] = [call_entry(call) for call in answer.calls]
        choice = {
            "index": 0,
            "message": message,
            "finish_reason": _finish(result, answer),
            "logprobs": self._chat_logprobs(None if answer.calls else result.logprobs),
        }
        return self._body([choice], result)

    def text(self, result: GenerationResult) -> dict[str, Any]:
        choice = {
            "index": 0,
            "text": result.text,
            "logprobs": self._completion_logprobs(result.logprobs),
            "finish_reason": OPENAI_FINISH[result.finish_reason],
        }
        return self._body([choice], result)

    async def chat_chunks(self, reply: ChatReply, usage: bool) -> AsyncIterator[str]:
        """Text and calls as they form, each call as OpenAI streams one: id, type and name
        in its first delta, then its arguments in pieces."""

        def chunk(
            delta: dict[str, Any] | None, finish: str | None = None, logprobs: Any = None
        ) -> str:
            body = {"index": 0, "delta": delta or {}, "finish_reason": finish, "logprobs": logprobs}
            return self._chunk([body])

        yield chunk({"role": "assistant", "content": ""})
        try:
            async for event in reply.events():
                if not isinstance(event, ChatOutcome):
                    shown = event.logprobs if isinstance(event, TextDelta) else ()
                    # (text re-read for calls carries none: null, as a call's pieces)
                    yield chunk(reply_delta(event), None, self._chat_logprobs(shown or None))
                    continue
                yield chunk(None, _finish(event.result, event.answer))
                if usage:
                    yield self._chunk([], _usage(event.result))
        except SemanticError as error:  # typed as the same error outside a stream would be
            yield sse_data(body_for("/v1/chat/completions", problem_for(error)))
        yield "data: [DONE]\n\n"

    async def text_chunks(self, reply: ChatReply, usage: bool) -> AsyncIterator[str]:
        offset = 0

        def chunk(text: str, finish: str | None, logprobs: Any = None) -> str:
            body = {"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs}
            return self._chunk([body])

        try:
            async for event in reply.events():
                if isinstance(event, TextDelta):
                    lists = self._completion_logprobs(event.logprobs, offset)
                    offset += len(event.text)
                    yield chunk(event.text, None, lists)
                elif isinstance(event, ChatOutcome):
                    yield chunk("", OPENAI_FINISH[event.result.finish_reason])
                    if usage:
                        yield self._chunk([], _usage(event.result))
        except SemanticError as error:  # typed as the same error outside a stream would be
            yield sse_data(body_for("/v1/chat/completions", problem_for(error)))
        yield "data: [DONE]\n\n"

    def _chat_logprobs(self, entries: Sequence[TokenLogprob] | None) -> dict[str, Any] | None:
        """Chat's ``logprobs`` for ``entries``, where the request asked (else None)."""
        if self.texts is None or entries is None:
            return None
        return chat_content(entries, self.texts)

    def _completion_logprobs(
        self, entries: Sequence[TokenLogprob], offset: int = 0
    ) -> dict[str, Any] | None:
        """The completions' ``logprobs`` for ``entries``, where the request asked (else None)."""
        return None if self.texts is None else completion_lists(entries, self.texts, offset)

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
    if data.stream_options is not None and not data.stream:
        raise InvalidRequestError("stream_options needs stream=true", param="stream_options")


def _check_completion_only(data: CompletionRequest) -> None:
    must_default(data.echo, False, "echo")
    must_default(data.best_of, 1, "best_of")
    must_default(data.suffix or None, None, "suffix")


def _check_chat_only(data: ChatCompletionRequest) -> None:
    """Chat fields this server has no use for are fine at their neutral values only."""
    must_default(data.prediction, None, "prediction")
    if data.functions:
        raise InvalidRequestError("functions are not supported; use tools", param="functions")
    if data.max_completion_tokens is not None and data.max_completion_tokens < 1:
        message = f"max_completion_tokens must be at least 1, got {data.max_completion_tokens}"
        raise InvalidRequestError(message, param="max_completion_tokens")
    if data.function_call not in (None, "none", "auto"):
        message = "function_call is not supported; use tools and tool_choice"
        raise InvalidRequestError(message, param="function_call")
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


def _ask(request: Request[Any, Any, Any], data: SamplingFields, **asked: Any) -> ChatAsk:
    """The request as the chat turn takes it: who asks, how to sample, and ``asked``."""
    who = identity(request)
    return ChatAsk(
        who.namespace,
        who.agent_id or cache_key_agent(data.prompt_cache_key),
        sampling=sampling(
            data.temperature,
            data.top_p,
            data.seed,
            data.top_k,
            penalties=(data.presence_penalty, data.frequency_penalty),
            bias=data.logit_bias,
        ),
        stop=stop_strings(data.stop),
        priority=who.priority,
        retention=openai_hints(request, data.prompt_cache_retention),
        **asked,
    )


def _texts(ask: ChatAsk, found: Services) -> TokenPieces | None:
    """Each token's text, for the log-probabilities the request asked for (else None)."""
    if ask.logprobs is None:
        return None
    return remembered(found.chats.token_piece)


def _prompt(prompt: str | list[Any]) -> str | tuple[int, ...]:
    """The prompt as one text or its token ids, as OpenAI's API allows (a list of ids,
    or a list holding one)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if not prompt:
        raise InvalidRequestError("prompt must not be empty", param="prompt")
    if all(isinstance(p, str | list) for p in prompt):
        raise InvalidRequestError("exactly one prompt per request is supported", param="prompt")
    if not all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        raise InvalidRequestError(
            "prompt must be a string, or token ids (a list of integers)", param="prompt"
        )
    return tuple(prompt)
