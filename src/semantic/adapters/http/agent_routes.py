"""The stateful agents API: the server keeps transcripts; clients send the new message."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from litestar import Controller, Request, delete, get, patch, post
from litestar.datastructures import State

from semantic.adapters.http.agent_schemas import CreateAgent, ForkAgent, PatchAgent, SendMessage
from semantic.adapters.http.common import services, sse, sse_data, unless_client_leaves
from semantic.adapters.http.errors import body_for, problem_for
from semantic.adapters.http.identity import (
    NAMESPACE_HEADER,
    NamespaceNotAllowedError,
    bound_namespace,
    checked_id,
    identity,
)
from semantic.adapters.http.openai_tools import call_entry, openai_tool_use, reply_delta
from semantic.adapters.http.retention_hints import header_hints, keep_hints
from semantic.adapters.http.strict_body import StrictBody
from semantic.adapters.http.translate import OPENAI_FINISH, sampling, stop_strings
from semantic.application.agents.values import AgentInfo, CommittedReply, Turn
from semantic.application.chat.generation import GenerationResult, TextDelta
from semantic.application.chat.tool_replies import ArgumentsDelta, CallOpened, TurnEvent
from semantic.application.chat.transcript import record_calls
from semantic.domain.context_edits import ContextPolicy
from semantic.domain.errors import InvalidRequestError, SemanticError
from semantic.domain.retention import Retention
from semantic.ports.metadata_store import MessageRecord


class AgentController(Controller):
    path = "/v1/agents"
    tags = ("Agents",)

    @post("/", status_code=201, dto=StrictBody[CreateAgent])
    async def create(
        self, request: Request[Any, Any, Any], data: CreateAgent, state: State
    ) -> dict[str, Any]:
        bound = bound_namespace(request)
        if data.namespace and bound and data.namespace != bound:
            raise NamespaceNotAllowedError(bound, data.namespace)
        header = request.headers.get(NAMESPACE_HEADER)
        if data.namespace and header and data.namespace != header:
            raise InvalidRequestError(
                f"the body's namespace {data.namespace!r} differs from the {NAMESPACE_HEADER} "
                f"header's {header!r}; give one",
                param="namespace",
            )
        namespace = (
            checked_id(data.namespace, "namespace")
            if data.namespace
            else identity(request).namespace
        )
        rule = data.context
        context = None if rule is None else ContextPolicy(rule.edit, rule.trigger_tokens, rule.keep)
        change = {**(data.retention.change() if data.retention else {}), **header_hints(request)}
        retention = Retention().changed(change) if change else None
        info = await services(state).agents.create(
            namespace, checked_id(data.id, "id"), data.system_prompt, context, retention
        )
        return _agent(info)

    @patch("/{agent_id:str}", dto=StrictBody[PatchAgent])
    async def update(
        self, request: Request[Any, Any, Any], agent_id: str, data: PatchAgent, state: State
    ) -> dict[str, Any]:
        """Its retention hints: the fields given (``X-Retention``'s over the body's) change,
        the others stay."""
        namespace = identity(request).namespace
        agent_id = checked_id(agent_id, "agent_id")
        found = services(state)
        change = {**data.retention.change(), **header_hints(request)}
        await found.agents.retain(namespace, agent_id, change, known=True)
        return _agent(await found.agents.get(namespace, agent_id))

    @get("/")
    async def list_agents(
        self,
        request: Request[Any, Any, Any],
        state: State,
        limit: int | None = None,
        after: str | None = None,
    ) -> dict[str, Any]:
        """By id; ``limit`` and ``after`` (the last id of the page before) page through."""
        cursor = checked_id(after, "after") if after is not None else None
        infos, more = await services(state).agents.list_agents(
            identity(request).namespace, cursor, _checked_limit(limit)
        )
        return {"object": "list", "data": [_agent(i) for i in infos], "has_more": more}

    @get("/{agent_id:str}")
    async def get_agent(
        self, request: Request[Any, Any, Any], agent_id: str, state: State
    ) -> dict[str, Any]:
        namespace = identity(request).namespace
        return _agent(await services(state).agents.get(namespace, checked_id(agent_id, "agent_id")))

    @get("/{agent_id:str}/cache")
    async def cache_state(
        self, request: Request[Any, Any, Any], agent_id: str, state: State
    ) -> dict[str, Any]:
        namespace = identity(request).namespace
        info = await services(state).agents.get(namespace, checked_id(agent_id, "agent_id"))
        return _cache(info)

    @post("/{agent_id:str}/release", status_code=200)
    async def release(
        self, request: Request[Any, Any, Any], agent_id: str, state: State
    ) -> dict[str, Any]:
        """Its KV out of memory now, kept on disk."""
        namespace = identity(request).namespace
        agent_id = checked_id(agent_id, "agent_id")
        info, released = await services(state).agents.release(namespace, agent_id)
        return {**_agent(info), "released_blocks": released}

    @post("/{agent_id:str}/prefetch", status_code=200)
    async def prefetch(
        self, request: Request[Any, Any, Any], agent_id: str, state: State
    ) -> dict[str, Any]:
        """Its KV into memory ahead of its turn."""
        namespace = identity(request).namespace
        agent_id = checked_id(agent_id, "agent_id")
        info, loaded = await services(state).agents.prefetch(namespace, agent_id)
        return {**_agent(info), "loaded_tokens": loaded}

    @delete("/{agent_id:str}", status_code=204)
    async def delete_agent(
        self, request: Request[Any, Any, Any], agent_id: str, state: State
    ) -> None:
        namespace = identity(request).namespace
        await services(state).agents.delete(namespace, checked_id(agent_id, "agent_id"))

    @post("/{agent_id:str}/fork", status_code=201, dto=StrictBody[ForkAgent])
    async def fork(
        self, request: Request[Any, Any, Any], agent_id: str, data: ForkAgent, state: State
    ) -> dict[str, Any]:
        namespace = identity(request).namespace
        info = await services(state).agents.fork(
            namespace, checked_id(agent_id, "agent_id"), checked_id(data.id, "id")
        )
        return _agent(info)

    @get("/{agent_id:str}/messages")
    async def messages(
        self,
        request: Request[Any, Any, Any],
        agent_id: str,
        state: State,
        limit: int | None = None,
        after: str | None = None,
    ) -> dict[str, Any]:
        """Oldest first; each message's ``id`` is its place in the transcript (``msg_1``
        ...), so ``after`` a message's id and ``limit`` page through."""
        namespace = identity(request).namespace
        records = await services(state).agents.messages(namespace, checked_id(agent_id, "agent_id"))
        start = _message_place(after) if after is not None else 0
        page_size = _checked_limit(limit)
        end = len(records) if page_size is None else start + page_size
        page = [_message(start + i + 1, m) for i, m in enumerate(records[start:end])]
        return {"object": "list", "data": page, "has_more": end < len(records)}

    @post("/{agent_id:str}/messages", status_code=200, dto=StrictBody[SendMessage])
    async def send(
        self, request: Request[Any, Any, Any], agent_id: str, data: SendMessage, state: State
    ) -> Any:
        who = identity(request)
        temperature = 0.0 if data.temperature is None else data.temperature
        if data.role not in ("user", "tool") or (data.role == "tool") != bool(data.tool_call_id):
            raise InvalidRequestError(
                "role is 'user', or 'tool' with the tool_call_id its result answers",
                param="role" if data.role not in ("user", "tool") else "tool_call_id",
            )
        turn = Turn(
            data.content,
            data.max_tokens,
            sampling(temperature, data.top_p, data.seed, data.top_k),
            stop_strings(data.stop),
            who.priority,
            data.tool_call_id,
            openai_tool_use(data.tools, data.tool_choice, data.parallel_tool_calls),
        )
        agent_id = checked_id(agent_id, "agent_id")
        found = services(state)
        hints = header_hints(request)  # X-Retention: this turn on, the agent's hints
        if hints:
            Retention().changed(hints)  # out of range: refused before anything changes
            await keep_hints(found, who.namespace, agent_id, hints, known=True)
        events = found.agents.send(who.namespace, agent_id, turn)
        # The first event surfaces errors (unknown agent, bad input) as HTTP codes; it comes
        # after the whole prefill, which a client that leaves meanwhile cancels.
        first = await unless_client_leaves(request, anext(events))
        if data.stream:
            return sse(_stream(first, events), events.aclose)
        return _reply(await unless_client_leaves(request, _last(first, events)))


async def _last(first: TurnEvent, rest: AsyncIterator[TurnEvent]) -> GenerationResult:
    result = first
    async for event in rest:
        result = event
    if not isinstance(result, GenerationResult):
        raise SemanticError("the turn ended without a reply")
    return result


async def _stream(first: TurnEvent, rest: AsyncIterator[TurnEvent]) -> AsyncIterator[str]:
    try:
        event: TurnEvent | None = first
        while event is not None:
            if isinstance(event, TextDelta):
                yield sse_data({"type": "delta", "content": event.text}, "delta")
            elif isinstance(event, CallOpened | ArgumentsDelta):
                yield sse_data({"type": "tool_call_delta", **reply_delta(event)}, "tool_call_delta")
            else:
                yield sse_data({"type": "message", **_reply(event)}, "message")
            event = await anext(rest, None)
    except SemanticError as error:  # as a refusal before the stream is worded: type, code
        yield sse_data({"type": "error", **body_for("/v1/agents", problem_for(error))}, "error")


def _reply(result: GenerationResult) -> dict[str, Any]:
    usage = result.usage
    numbered = {"id": f"msg_{result.place}"} if isinstance(result, CommittedReply) else {}
    calls = result.calls if isinstance(result, CommittedReply) else ()
    whole = isinstance(result, CommittedReply) and result.whole_calls
    finish = "tool_calls" if whole else OPENAI_FINISH[result.finish_reason]
    called = {"tool_calls": [call_entry(c) for c in calls]} if calls else {}
    return {
        **numbered,
        "role": "assistant",
        "content": result.text,
        **called,
        "finish_reason": finish,
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "cached_tokens": usage.cached_tokens,
        },
    }


def _cache(info: AgentInfo) -> dict[str, Any]:
    cache = info.cache
    return {
        "tokens": cache.tokens,
        "blocks": cache.blocks,
        "hot_blocks": cache.hot_blocks,
        "disk_blocks": cache.disk_blocks,
        "bytes_on_disk": cache.bytes_on_disk,
    }


def _agent(info: AgentInfo) -> dict[str, Any]:
    return {
        "id": info.agent_id,
        "object": "agent",
        "namespace": info.namespace,
        "system_prompt": info.system_prompt,
        "created_at": info.created_at,
        "last_used": info.last_used,
        "messages": info.messages,
        "cache": _cache(info),
        "context": None if info.context is None else _context(info.context),
        "retention": _retention(info),
    }


def _retention(info: AgentInfo) -> dict[str, Any]:
    return {**info.retention.as_dict(), "ttl_ends_at": info.ttl_ends_at}


def _context(policy: ContextPolicy) -> dict[str, Any]:
    return {"edit": policy.edit, "trigger_tokens": policy.trigger_tokens, "keep": policy.keep}


MAX_PAGE = 1000


def _checked_limit(limit: int | None) -> int | None:
    if limit is not None and not 1 <= limit <= MAX_PAGE:
        message = f"limit must be between 1 and {MAX_PAGE}, got {limit}"
        raise InvalidRequestError(message, param="limit")
    return limit


def _message_place(message_id: str) -> int:
    """``msg_N`` -> N: the messages after it start at index N."""
    number = message_id.removeprefix("msg_")
    if number == message_id or not (number.isascii() and number.isdigit()) or len(number) > 9:
        message = f"after must be a message id (msg_N), got {message_id!r}"
        raise InvalidRequestError(message, param="after")
    return int(number)


def _message(place: int, message: MessageRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": f"msg_{place}",
        "role": message.role,
        "content": message.content,
        "created_at": message.created_at,
    }
    calls = record_calls(message)
    if calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out
