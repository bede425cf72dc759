"""Anthropic's ``thread`` on ``/v1/messages`` (its ``message-threads`` beta, which the
SDK's tool runner asks for): ``{"type": "create"}`` holds the conversation under the reply's
id; ``{"type": "continue", "previous_message_id": ...}`` sends only the turn's new messages,
and the system prompt, tools and earlier messages come from the thread
(``MessageThreads``). The reply is the one the whole conversation gets, sent whole."""

from __future__ import annotations

from typing import Any

import msgspec

from semantic.adapters.http.anthropic_schemas import AnthropicMessage, MessagesRequest, TextBlock
from semantic.adapters.http.identity import checked_id
from semantic.adapters.http.state import Services
from semantic.domain.errors import InvalidRequestError

FROM_THE_THREAD = ("system", "tools")
"""What a continuation takes from its thread, and is refused for sending again."""


class _Held(msgspec.Struct, forbid_unknown_fields=True):
    system: str | list[TextBlock] | None
    tools: list[dict[str, Any]] | None
    messages: list[AnthropicMessage]


async def whole_request(found: Services, namespace: str, data: MessagesRequest) -> MessagesRequest:
    """The request as the conversation it continues makes it (itself where it continues
    none)."""
    thread = data.thread
    if thread is None or thread.get("type") == "create":
        return data
    if thread.get("type") != "continue":
        raise InvalidRequestError("thread.type must be 'create' or 'continue'", param="thread")
    previous = thread.get("previous_message_id")
    if not isinstance(previous, str):
        message = "thread.previous_message_id must be the id of a reply"
        raise InvalidRequestError(message, param="thread.previous_message_id")
    for field in FROM_THE_THREAD:
        if getattr(data, field) is not None:
            message = f"{field} comes from the thread on a continue: leave it out"
            raise InvalidRequestError(message, param=field)
    if not data.messages:
        message = "a continue sends the turn's new messages"
        raise InvalidRequestError(message, param="messages")
    held = await found.chats.threads.held(namespace, checked_id(previous, "previous_message_id"))
    earlier = msgspec.json.decode(held, type=_Held)
    messages = [*earlier.messages, *data.messages]
    return msgspec.structs.replace(
        data, system=earlier.system, tools=earlier.tools, messages=messages
    )


async def hold(
    found: Services,
    namespace: str,
    whole: MessagesRequest,
    message_id: str,
    content: list[dict[str, Any]],
) -> None:
    """The conversation with its reply (``content``, as the reply's body shows it), held
    under the reply's id where the request is in a thread."""
    if whole.thread is None:
        return
    reply = msgspec.convert({"role": "assistant", "content": content}, AnthropicMessage)
    held = _Held(whole.system, whole.tools, [*whole.messages, reply])
    continued = whole.thread.get("previous_message_id")
    await found.chats.threads.hold(
        namespace,
        message_id,
        msgspec.json.encode(held).decode(),
        moves_on=continued if isinstance(continued, str) else None,
    )
