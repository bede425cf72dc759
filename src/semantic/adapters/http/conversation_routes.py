"""OpenAI's Conversations API: ``/v1/conversations`` and their items, kept beside the
responses made in them (ADR 0020)."""

from __future__ import annotations

import json
import time
from typing import Any

from litestar import Controller, Request, delete, get, post
from litestar.datastructures import State

from semantic.adapters.http.common import services
from semantic.adapters.http.identity import checked_id, identity
from semantic.adapters.http.responses_items import (
    fresh_id,
    input_items,
    new_id,
    page,
    unanswerable,
)
from semantic.adapters.http.responses_schemas import (
    AddItems,
    CreateConversation,
    UpdateConversation,
)
from semantic.adapters.http.strict_body import StrictBody
from semantic.application.agents.responses import CONVERSATION, ITEM
from semantic.domain.errors import InvalidRequestError
from semantic.ports.object_store import StoredObject


class ConversationController(Controller):
    path = "/v1/conversations"
    tags = ("OpenAI Conversations",)

    @post("/", status_code=200, dto=StrictBody[CreateConversation])
    async def create(
        self, request: Request[Any, Any, Any], data: CreateConversation, state: State
    ) -> dict[str, Any]:
        conversation_id = new_id("conv")
        conversation: dict[str, Any] = {
            "id": conversation_id,
            "object": "conversation",
            "created_at": int(time.time()),
            "metadata": data.metadata or {},
        }
        items = _answered(_fresh(input_items(data.items, "items")) if data.items else [], [])
        kept = [StoredObject(CONVERSATION, conversation_id, json.dumps(conversation))]
        kept += _item_objects(conversation_id, items)
        await services(state).responses.put(identity(request).namespace, kept)
        return conversation

    @get("/{conversation_id:str}")
    async def get_conversation(
        self, request: Request[Any, Any, Any], conversation_id: str, state: State
    ) -> dict[str, Any]:
        service = services(state).responses
        stored = await service.conversation(identity(request).namespace, _id(conversation_id))
        body: dict[str, Any] = json.loads(stored.body)
        return body

    @post("/{conversation_id:str}", status_code=200, dto=StrictBody[UpdateConversation])
    async def update(
        self,
        request: Request[Any, Any, Any],
        conversation_id: str,
        data: UpdateConversation,
        state: State,
    ) -> dict[str, Any]:
        service, namespace = services(state).responses, identity(request).namespace
        stored = await service.conversation(namespace, _id(conversation_id))
        body: dict[str, Any] = {**json.loads(stored.body), "metadata": data.metadata or {}}
        await service.put(namespace, [StoredObject(CONVERSATION, body["id"], json.dumps(body))])
        return body

    @delete("/{conversation_id:str}", status_code=200)
    async def delete_conversation(
        self, request: Request[Any, Any, Any], conversation_id: str, state: State
    ) -> dict[str, Any]:
        service = services(state).responses
        await service.delete_conversation(identity(request).namespace, _id(conversation_id))
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    @get("/{conversation_id:str}/items")
    async def list_items(
        self,
        request: Request[Any, Any, Any],
        conversation_id: str,
        state: State,
        *,
        limit: int = 20,
        after: str | None = None,
        order: str = "desc",
    ) -> dict[str, Any]:
        service = services(state).responses
        stored = await service.conversation_items(identity(request).namespace, _id(conversation_id))
        return page([json.loads(o.body) for o in stored], limit, after, order)

    @post("/{conversation_id:str}/items", status_code=200, dto=StrictBody[AddItems])
    async def add_items(
        self,
        request: Request[Any, Any, Any],
        conversation_id: str,
        data: AddItems,
        state: State,
    ) -> dict[str, Any]:
        service, namespace = services(state).responses, identity(request).namespace
        await service.conversation(namespace, _id(conversation_id))
        stored = await service.conversation_items(namespace, conversation_id)
        items = _answered(
            _fresh(input_items(data.items, "items")), [json.loads(o.body) for o in stored]
        )
        await service.put(namespace, _item_objects(conversation_id, items))
        return {
            "object": "list",
            "data": items,
            "first_id": items[0]["id"],
            "last_id": items[-1]["id"],
            "has_more": False,
        }

    @get("/{conversation_id:str}/items/{item_id:str}")
    async def get_item(
        self, request: Request[Any, Any, Any], conversation_id: str, item_id: str, state: State
    ) -> dict[str, Any]:
        service = services(state).responses
        stored = await service.item(identity(request).namespace, _id(conversation_id), _id(item_id))
        body: dict[str, Any] = json.loads(stored.body)
        return body

    @delete("/{conversation_id:str}/items/{item_id:str}", status_code=200)
    async def delete_item(
        self, request: Request[Any, Any, Any], conversation_id: str, item_id: str, state: State
    ) -> dict[str, Any]:
        service, namespace = services(state).responses, identity(request).namespace
        await service.delete_item(namespace, _id(conversation_id), _id(item_id))
        stored = await service.conversation(namespace, conversation_id)
        body: dict[str, Any] = json.loads(stored.body)
        return body


def _fresh(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items get ids of their own: an id a client gave may be another's."""
    return [{**item, "id": fresh_id(item)} for item in items]


def _item_objects(conversation_id: str, items: list[dict[str, Any]]) -> list[StoredObject]:
    return [StoredObject(ITEM, i["id"], json.dumps(i), conversation_id) for i in items]


def _id(value: str) -> str:
    return checked_id(value, "id")


def _answered(items: list[dict[str, Any]], stored: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items``, refused where a ``function_call_output`` answers no call of the
    conversation: kept, it would fail every response in the conversation after it."""
    orphans = unanswerable(items, stored)
    if orphans:
        raise InvalidRequestError(
            f"items: the function_call_output for call_id {orphans[0]!r} answers no "
            "function_call of this conversation",
            param="items",
        )
    return items
