"""OpenAI's Responses API: ``/v1/responses``, a front door onto the agents use case whose
chains resume from stored KV (ADR 0020)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from litestar import Controller, Request, delete, get, post
from litestar.datastructures import State
from litestar.exceptions import NotFoundException

from semantic.adapters.http.common import services, sse, unless_client_leaves
from semantic.adapters.http.errors import in_own_words
from semantic.adapters.http.identity import checked_id, identity
from semantic.adapters.http.openai_logprobs import (
    TokenPieces,
    pieces_for,
    token_entries,
)
from semantic.adapters.http.responses_asks import response_ask
from semantic.adapters.http.responses_items import (
    fresh_id,
    new_id,
    output_items,
    page,
)
from semantic.adapters.http.responses_schemas import InputTokensRequest, ResponseRequest
from semantic.adapters.http.responses_stream import ResponseEvents
from semantic.adapters.http.retention_hints import openai_hints
from semantic.adapters.http.strict_body import StrictBody
from semantic.application.agents.responses import (
    INPUT_ITEM,
    ITEM,
    RESPONSE,
    ResponseEvent,
)
from semantic.application.agents.values import CommittedReply
from semantic.application.chat.generation import GenerationResult
from semantic.domain.errors import InvalidRequestError, PromptTooLongError, SemanticError
from semantic.domain.generation import LIMITS
from semantic.domain.retention import Retention
from semantic.ports.object_store import StoredObject


class ResponsesController(Controller):
    path = "/v1/responses"
    tags = ("OpenAI Responses",)

    @post("/", status_code=200, dto=StrictBody[ResponseRequest])
    async def create(
        self, request: Request[Any, Any, Any], data: ResponseRequest, state: State
    ) -> Any:
        found = services(state)
        namespace = identity(request).namespace
        retention = _retention(request, data.prompt_cache_retention)
        ask, items = await response_ask(found, namespace, data, retention)
        response_id, turn, message_id = ask.response_id, ask.turn, new_id("msg")
        body = _Body(
            response_id,
            message_id,
            data,
            model=found.model_id,
            conversation=ask.conversation_id,
            items=items,
            pieces=pieces_for(turn.logprobs, found.chats.token_piece),
        )
        events = found.responses.create(namespace, ask, body.keep)
        first = await _first(request, events, data)
        if data.stream:
            stream = ResponseEvents(body.started(), message_id, body.pieces)
            return sse(stream.stream(first, events, body.final), events.aclose)
        await unless_client_leaves(request, _last(first, events))
        return body.final()

    @get("/{response_id:str}")
    async def get_response(
        self,
        request: Request[Any, Any, Any],
        response_id: str,
        state: State,
        stream: bool | None = None,
    ) -> dict[str, Any]:
        """The stored response; ``stream=true`` is OpenAI's for background responses,
        which are not served, so it is refused rather than answered with nothing."""
        if stream:
            raise InvalidRequestError(
                "stream: a response streams as it is created; retrieve a stored one whole "
                "(background responses are not served)",
                param="stream",
            )
        service = services(state).responses
        stored = await service.response(identity(request).namespace, _id(response_id))
        body: dict[str, Any] = json.loads(stored.body)
        return body

    @post("/input_tokens", status_code=200, dto=StrictBody[InputTokensRequest])
    async def input_tokens(
        self, request: Request[Any, Any, Any], data: InputTokensRequest, state: State
    ) -> dict[str, Any]:
        """How many tokens the response's prompt would hold: its chain or conversation,
        instructions, tools and format, rendered as a response renders them, no turn run.
        Counted whole: ``truncation`` would drop the oldest turns only when a turn runs."""
        found = services(state)
        namespace = identity(request).namespace
        ask, _ = await response_ask(found, namespace, data.as_response())
        counted = await found.responses.input_tokens(namespace, ask)
        return {"object": "response.input_tokens", "input_tokens": counted}

    @post("/compact", include_in_schema=False)
    async def unserved(self) -> None:
        """The SDK's ``responses.compact``: not served, and said so as an unknown endpoint
        is (the ``/{response_id}`` routes beside it answered a 405 naming GET and DELETE)."""
        raise NotFoundException()

    @delete("/{response_id:str}", status_code=200)
    async def delete_response(
        self, request: Request[Any, Any, Any], response_id: str, state: State
    ) -> dict[str, Any]:
        service = services(state).responses
        await service.delete_response(identity(request).namespace, _id(response_id))
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    @get("/{response_id:str}/input_items")
    async def list_input_items(
        self,
        request: Request[Any, Any, Any],
        response_id: str,
        state: State,
        *,
        limit: int = 20,
        after: str | None = None,
        order: str = "desc",
    ) -> dict[str, Any]:
        service = services(state).responses
        stored = await service.input_items(identity(request).namespace, _id(response_id))
        return page([json.loads(o.body) for o in stored], limit, after, order)


def _id(value: str) -> str:
    return checked_id(value, "id")


class _Body:
    """The response object, as started and as stored once its reply is committed."""

    def __init__(
        self,
        response_id: str,
        message_id: str,
        data: ResponseRequest,
        *,
        model: str,
        conversation: str | None,
        items: list[dict[str, Any]],
        pieces: TokenPieces | None,
    ) -> None:
        """``pieces``: each token as its entries show it, where the request asked for
        log-probabilities."""
        self.response_id = response_id
        self.message_id = message_id
        self.data = data
        self.model = model
        self.conversation = conversation
        self.items = items
        self.pieces = pieces
        self.created_at = int(time.time())
        self.body: dict[str, Any] | None = None

    def started(self) -> dict[str, Any]:
        return self._shape("in_progress", [], None)

    def final(self) -> dict[str, Any]:
        if self.body is None:
            raise SemanticError("the response ended without a reply")
        return self.body

    def keep(self, reply: CommittedReply) -> list[StoredObject]:
        shown = [] if self.pieces is None else token_entries(reply.logprobs, self.pieces)
        output = output_items(reply, self.message_id, shown)
        status = "incomplete" if reply.finish_reason in LIMITS else "completed"  # calls too
        self.body = self._shape(status, output, reply)
        rid = self.response_id
        kept = [StoredObject(RESPONSE, rid, json.dumps(self.body))]
        kept += [
            StoredObject(INPUT_ITEM, f"{rid}/{i['id']}", json.dumps(i), rid) for i in self.items
        ]
        if self.conversation is not None:  # input items anew (a client's id may be taken);
            fresh = [{**item, "id": fresh_id(item)} for item in self.items]  # output's its own
            for item in [*fresh, *output]:
                kept.append(StoredObject(ITEM, item["id"], json.dumps(item), self.conversation))
        return kept

    def _shape(
        self, status: str, output: list[dict[str, Any]], reply: GenerationResult | None
    ) -> dict[str, Any]:
        data = self.data
        usage = None
        if reply is not None:
            u = reply.usage
            usage = {
                "input_tokens": u.prompt_tokens,
                "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
                "output_tokens": u.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": u.prompt_tokens + u.completion_tokens,
            }
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": int(time.time()) if status == "completed" else None,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": data.instructions,
            "max_output_tokens": data.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": data.parallel_tool_calls is not False,
            "previous_response_id": data.previous_response_id,
            "conversation": {"id": self.conversation} if self.conversation else None,
            "reasoning": {"effort": None, "summary": None},
            "store": data.store is not False,
            "temperature": data.temperature,
            "top_p": data.top_p,
            "text": data.text or {"format": {"type": "text"}},
            "tool_choice": data.tool_choice or "auto",
            "tools": data.tools or [],
            "top_logprobs": data.top_logprobs,
            "truncation": data.truncation or "disabled",
            "usage": usage,
            "metadata": data.metadata or {},
            "user": data.user,
            "prompt_cache_key": data.prompt_cache_key,
            "prompt_cache_retention": data.prompt_cache_retention,
            "safety_identifier": data.safety_identifier,
            "max_tool_calls": data.max_tool_calls,
        }


async def _first(
    request: Request[Any, Any, Any],
    events: AsyncIterator[ResponseEvent],
    data: ResponseRequest,
) -> ResponseEvent:
    """The first event, ``TurnStarted`` once the request is queued, surfaces errors
    (unknown previous response, bad input, a full queue) as codes; a stream opens then,
    with ``response.created``, as OpenAI's does, not at the first token."""
    try:
        return await unless_client_leaves(request, anext(events))
    except PromptTooLongError as error:
        raise _too_long(error, data) from None
    except InvalidRequestError as error:
        if error.param == "max_tokens":
            raise in_own_words(
                error, "max_tokens", "max_output_tokens", "max_output_tokens"
            ) from None
        if error.param == "response_format":  # the grammar engine's refusal of text.format
            raise in_own_words(error, "response_format", "text.format", "text") from None
        if error.param == "messages":  # the chat's prompt (a template's refusal): the input
            error.param = "input"
        raise


def _too_long(error: PromptTooLongError, data: ResponseRequest) -> PromptTooLongError:
    """The agents' refusal in the Responses API's words: the reply asked for does not fit
    (``max_output_tokens``), or the chain with this input does not (``input``; with
    ``truncation: "auto"``, this input with none of the chain before it)."""
    message = str(error).replace("max_tokens", "max_output_tokens")
    if error.param in ("max_tokens", "instructions"):
        param = "max_output_tokens" if error.param == "max_tokens" else "instructions"
        return PromptTooLongError(message, param=param)
    if data.truncation == "auto":
        return PromptTooLongError(
            f"{message}: the input does not fit even with the whole chain before it dropped",
            param="input",
        )
    return PromptTooLongError(
        f"{message} (truncation is disabled: the request fails rather than drop items)",
        param="input",
    )


async def _last(first: ResponseEvent, rest: AsyncIterator[ResponseEvent]) -> None:
    result = first
    async for event in rest:
        result = event
    if not isinstance(result, CommittedReply):
        raise SemanticError("the response ended without a reply")


def _retention(request: Request[Any, Any, Any], asked: str | None) -> str | None:
    """The response's agent's hints: ``prompt_cache_retention``, then ``X-Retention``."""
    change = openai_hints(request, asked)
    return Retention().changed(change).to_json() if change else None
