"""A Responses request as the agents use case takes it (``ResponseAsk``): its input items,
tools, format and the conversation around it read and refused where they must be, once for
a response and for a count of its input tokens alike."""

from __future__ import annotations

import json
from typing import Any

from semantic.adapters.http.errors import in_own_words
from semantic.adapters.http.identity import checked_id
from semantic.adapters.http.openai_logprobs import responses_logprobs_asked
from semantic.adapters.http.openai_tools import openai_tool_use
from semantic.adapters.http.responses_checks import check_unserved
from semantic.adapters.http.responses_items import (
    input_items,
    item_messages,
    new_id,
    stored_messages,
)
from semantic.adapters.http.responses_schemas import ResponseRequest
from semantic.adapters.http.state import Services
from semantic.adapters.http.tool_translate import response_schema
from semantic.adapters.http.translate import check_model, sampling
from semantic.application.agents.responses import ResponseAsk
from semantic.application.agents.values import Turn
from semantic.domain.constraints import OutputConstraint
from semantic.domain.errors import InvalidRequestError
from semantic.domain.tools import ToolUse


async def response_ask(
    found: Services, namespace: str, data: ResponseRequest, retention: str | None = None
) -> tuple[ResponseAsk, list[dict[str, Any]]]:
    """The request as the use case takes it, under a new response id, and its input items
    (as the response's input items keep them); every refusal comes before any read."""
    if data.model is not None:
        check_model(data.model, found.model_id)
    check_unserved(data)
    items = input_items(data.input)
    turn = _turn(data, items, _tool_use(data))
    conversation = _conversation_id(data)
    history = await _conversation_items(found, namespace, conversation)
    ask = ResponseAsk(
        new_id("resp"),
        turn,
        data.instructions,
        data.previous_response_id,
        conversation,
        stored_messages(history),
        tuple(i["id"] for i in history),
        data.store is not False,
        truncate=data.truncation == "auto",
        retention=retention,
    )
    return ask, items


async def _conversation_items(
    found: Services, namespace: str, conversation: str | None
) -> list[dict[str, Any]]:
    """The items of the conversation a response is in (none outside one)."""
    if conversation is None:
        return []
    stored = await found.responses.conversation_items(namespace, conversation)
    return [json.loads(o.body) for o in stored]


def _turn(data: ResponseRequest, items: list[dict[str, Any]], use: ToolUse | None) -> Turn:
    return Turn(
        "",
        data.max_output_tokens,
        sampling(data.temperature, data.top_p, None),
        tools=use,
        items=item_messages(items),
        constraint=_schema_constraint(_text_schema(data.text)),
        logprobs=responses_logprobs_asked(data.include, data.top_logprobs),
    )


def _conversation_id(data: ResponseRequest) -> str | None:
    conversation = data.conversation
    if isinstance(conversation, dict):
        conversation = conversation.get("id")
        if not isinstance(conversation, str):
            raise InvalidRequestError("conversation.id must be a string", param="conversation")
    return None if conversation is None else checked_id(conversation, "conversation")


def _tool_use(data: ResponseRequest) -> ToolUse | None:
    """The Responses API's flat function tools in the chat shape the use case reads."""
    tools = []
    for index, tool in enumerate(data.tools or []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise InvalidRequestError(
                f"tools[{index}]: hosted tools ({kind!r}) are not served; only function tools",
                param="tools",
            )
        function = {
            k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool
        }
        tools.append({"type": "function", "function": function})
    choice = data.tool_choice
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise InvalidRequestError(
                f"tool_choice of type {choice.get('type')!r} is not served", param="tool_choice"
            )
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    return openai_tool_use(tools, choice, data.parallel_tool_calls)


def _schema_constraint(schema: str | None) -> OutputConstraint | None:
    """The schema a reply that calls no tool must match (``reply_shape``, ADR 0018)."""
    return None if schema is None else OutputConstraint(json_schema=schema)


def _text_schema(text: dict[str, Any] | None) -> str | None:
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise InvalidRequestError("text.format must be an object with a type", param="text")
    shaped = dict(fmt)
    if fmt.get("type") == "json_schema":
        spec = {k: v for k, v in fmt.items() if k != "type"}
        shaped = {"type": "json_schema", "json_schema": spec}
    try:
        return response_schema(shaped)
    except InvalidRequestError as error:
        raise in_own_words(error, "response_format", "text.format", "text") from None
