"""OpenAI-compatible endpoints: /v1/chat/completions, /v1/completions, /v1/models."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import time
from collections.abc import Callable, Sequence
from typing import Any

from litestar import Controller, Request, post, route
from litestar.datastructures import State

from semantic.adapters.http.common import (
    GET_AND_HEAD,
    services,
    sse,
    unless_client_leaves,
)
from semantic.adapters.http.identity import identity
from semantic.adapters.http.openai_bodies import ReplyBodies
from semantic.adapters.http.openai_functions import FUNCTION_CALL, FunctionHistory, function_use
from semantic.adapters.http.openai_logprobs import (
    chat_logprobs_asked,
    completion_logprobs_asked,
    pieces_for,
)
from semantic.adapters.http.openai_schemas import (
    ChatCompletionRequest,
    ChatMessageIn,
    CompletionRequest,
    SamplingFields,
)
from semantic.adapters.http.openai_tools import TOOL_CALLS, history_calls, openai_tool_use
from semantic.adapters.http.retention_hints import cache_key_agent, openai_hints
from semantic.adapters.http.state import Services
from semantic.adapters.http.strict_body import StrictBody
from semantic.adapters.http.tool_translate import (
    response_schema,
)
from semantic.adapters.http.translate import (
    chat,
    check_model,
    joined_text,
    must_default,
    sampling,
    stop_strings,
)
from semantic.application.chat.chat_reply import ChatOutcome, ChatReply
from semantic.application.chat.chat_turn import ChatAsk
from semantic.domain.chat import ChatMessage, check_tool_answers
from semantic.domain.errors import InvalidRequestError
from semantic.domain.tools import ToolUse

COMPLETION_DEFAULT_MAX_TOKENS = 16
"""OpenAI's default for legacy completions (chat replies run to the end of the turn)."""
MAX_CHOICES = 16
"""The most replies one request may ask for (``n``): each decodes as a request of its own."""

Chunk = Callable[[dict[str, Any] | None, str | None], dict[str, Any]]


class OpenAIController(Controller):
    path = "/v1"
    tags = ("OpenAI-compatible",)

    @route("/models", http_method=GET_AND_HEAD)
    async def models(self, state: State) -> dict[str, Any]:
        found = services(state)
        entry = _model_entry(found.model_id)
        return {
            "object": "list",
            "data": [entry],
            **{"has_more": False, "first_id": entry["id"], "last_id": entry["id"]},
        }

    @route("/models/{model_id:path}", http_method=GET_AND_HEAD)
    async def model(self, model_id: str, state: State) -> dict[str, Any]:
        """``model_id`` a path: a hub model is served as ``org/name``."""
        found = services(state)
        check_model(model_id.lstrip("/"), found.model_id)
        return {**_model_entry(found.model_id), "runtime": dict(found.runtime)}

    @post("/chat/completions", status_code=200, dto=StrictBody[ChatCompletionRequest])
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
        functions = FunctionHistory()
        messages = tuple(
            _chat_message(message, functions, place) for place, message in enumerate(data.messages)
        )
        if not messages:
            raise InvalidRequestError("messages must not be empty", param="messages")
        check_tool_answers(messages)
        newer = data.max_completion_tokens  # OpenAI's newer name wins where given
        ask = _ask(
            request,
            data,
            messages=messages,
            tools=_tool_use(data),
            json_schema=response_schema(data.response_format),
            max_tokens=data.max_tokens if newer is None else newer,
            logprobs=chat_logprobs_asked(data.logprobs, data.top_logprobs),
        )
        replies = await _started(found, ask, data.n or 1)
        pieces = pieces_for(ask.logprobs, found.chats.token_piece)
        calls = FUNCTION_CALL if data.functions else TOOL_CALLS
        bodies = ReplyBodies("chatcmpl", "chat.completion", found.model_id, pieces, calls)
        if data.stream:
            usage = bool(data.stream_options and data.stream_options.include_usage)
            return sse(bodies.chat_chunks(replies, usage), _closing(replies))
        return bodies.chat(await _outcomes(request, replies))

    @post("/completions", status_code=200, dto=StrictBody[CompletionRequest])
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
        replies = await _started(found, ask, data.n or 1)
        pieces = pieces_for(ask.logprobs, found.chats.token_piece)
        bodies = ReplyBodies("cmpl", "text_completion", found.model_id, pieces)
        if data.stream:
            usage = bool(data.stream_options and data.stream_options.include_usage)
            return sse(bodies.text_chunks(replies, usage), _closing(replies))
        return bodies.text([o.result for o in await _outcomes(request, replies)])


_SERVED_SINCE = int(time.time())
"""A model's ``created``: when this process started serving it (as vLLM answers)."""


def _model_entry(model_id: str) -> dict[str, Any]:
    """OpenAI's fields and Anthropic's (``type``, ``display_name``, ``created_at``): both
    SDKs list models at this one route."""
    created_at = datetime.datetime.fromtimestamp(_SERVED_SINCE, datetime.UTC)
    return {
        "id": model_id,
        "object": "model",
        "created": _SERVED_SINCE,
        "owned_by": "semantic",
        "type": "model",
        "display_name": model_id,
        "created_at": created_at.isoformat().replace("+00:00", "Z"),
    }


def _check_common(data: SamplingFields, found: Services) -> None:
    check_model(data.model, found.model_id)
    if not 1 <= (1 if data.n is None else data.n) <= MAX_CHOICES:
        raise InvalidRequestError(f"n must be between 1 and {MAX_CHOICES}, got {data.n}", param="n")
    if data.stream_options is not None and not data.stream:
        raise InvalidRequestError("stream_options needs stream=true", param="stream_options")


def _check_completion_only(data: CompletionRequest) -> None:
    must_default(data.echo, False, "echo")
    if data.best_of not in (None, 1, data.n or 1):
        raise InvalidRequestError("best_of is supported only equal to n", param="best_of")
    must_default(data.suffix or None, None, "suffix")


def _check_chat_only(data: ChatCompletionRequest) -> None:
    """Chat fields this server has no use for are fine at their neutral values only."""
    must_default(data.prediction, None, "prediction")
    if data.max_completion_tokens is not None and data.max_completion_tokens < 1:
        message = f"max_completion_tokens must be at least 1, got {data.max_completion_tokens}"
        raise InvalidRequestError(message, param="max_completion_tokens")
    for unused, neutral, name in (  # what this server does anyway is fine to ask for
        (data.reasoning_effort, "none", "reasoning_effort"),
        (data.audio, None, "audio"),
        (data.verbosity, "medium", "verbosity"),
        (data.web_search_options, None, "web_search_options"),
    ):
        must_default(unused, neutral, name)
    if data.modalities is not None and data.modalities != ["text"]:
        raise InvalidRequestError("only the 'text' modality is supported", param="modalities")


def _tool_use(data: ChatCompletionRequest) -> ToolUse | None:
    """``tools``, or the older ``functions`` (one call a reply); not both."""
    if not data.functions:
        if data.function_call not in (None, "none", "auto"):
            raise InvalidRequestError(
                "function_call names a function: give functions", param="function_call"
            )
        return openai_tool_use(data.tools, data.tool_choice, data.parallel_tool_calls)
    if data.tools:
        raise InvalidRequestError("give tools or the older functions, not both", param="functions")
    return function_use(data.functions, data.function_call)


def _chat_message(message: ChatMessageIn, functions: FunctionHistory, place: int) -> ChatMessage:
    """A history message as the model reads it. A reply sent back as OpenAI's SDKs dump it
    carries null tool and audio fields; only a non-empty one asks for what is missing. The
    older API's function calls and results are read as tool calls and results."""
    if message.role not in ("system", "developer", "user", "assistant", "tool", "function"):
        raise InvalidRequestError(
            f"message role {message.role!r} is not supported", param="messages"
        )
    if (message.tool_calls or message.function_call) and message.role != "assistant":
        raise InvalidRequestError(
            "only assistant messages have tool_calls or a function_call", param="messages"
        )
    if message.tool_calls and message.function_call:
        raise InvalidRequestError(
            "an assistant message has tool_calls or a function_call, not both", param="messages"
        )
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
    if message.role == "function":
        return functions.result(message, text)
    calls = history_calls(message.tool_calls or []) or functions.call(message, place)
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


async def _started(found: Services, ask: ChatAsk, n: int) -> list[ChatReply]:
    """``n`` replies to the prompt, choice ``i`` seeded ``seed + i`` where a seed is given
    (unseeded ones draw their own); none is left running if one is refused."""
    replies: list[ChatReply] = []
    try:
        for index in range(n):
            replies.append(await found.chats.start(_choice(ask, index)))
    except BaseException:
        _closing(replies)()
        raise
    return replies


def _choice(ask: ChatAsk, index: int) -> ChatAsk:
    """Choice 0 is the agent's reply (its KV kept as the agent's); the others are replies
    of no agent, so that an agent's record is not whichever choice ended last."""
    if index == 0:
        return ask
    seed = ask.sampling.seed
    sampling = ask.sampling
    if seed is not None:
        sampling = dataclasses.replace(sampling, seed=(seed + index) % 2**63)
    return dataclasses.replace(ask, agent_id=None, sampling=sampling)


def _closing(replies: Sequence[ChatReply]) -> Callable[[], None]:
    def close() -> None:
        for reply in replies:
            reply.close()

    return close


async def _outcomes(
    request: Request[Any, Any, Any], replies: Sequence[ChatReply]
) -> list[ChatOutcome]:
    """Every choice whole; a client that leaves ends them all."""
    try:
        every = asyncio.gather(*(reply.outcome() for reply in replies))
        return list(await unless_client_leaves(request, every))
    finally:
        _closing(replies)()


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
