"""The Responses API's chains and conversations on the stateful agents use case (ADR 0020).

Every stored response owns an internal agent (``~resp:<id>``). A response on
``previous_response_id`` forks the previous response's agent in one transaction (every block
shared, no KV copied; the message rows copied inside the database) and sends its input as
that fork's turn, so two responses on one previous id branch copy-on-write, and deleting a
response frees only what its agent alone held. A response's ``instructions`` are its own
system prompt: as at OpenAI, a previous response's are not carried over. A
conversation remembers the agent of its last response and the items it had then; a response
with ``conversation`` forks that agent while the items are unchanged, else starts one from
the items. What a response keeps (its body, its items) commits in one transaction before
the client is told it completed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass

from semantic.application.agents import INTERNAL_PREFIX, AgentService, CommittedReply, Turn
from semantic.application.generation import GenerationEvent
from semantic.domain.errors import AgentNotFoundError, ObjectNotFoundError, PromptTooLongError
from semantic.ports.metadata_store import MessageRecord
from semantic.ports.object_store import ObjectStore, StoredObject

RESPONSE = "response"
INPUT_ITEM = "input_item"
CHAIN = "chain"
"""A response's agent (the body is the agent id)."""
CONVERSATION = "conversation"
ITEM = "item"
CONVERSATION_CHAIN = "conversation_chain"
"""A conversation's last response's agent and the item ids it had then (JSON)."""

Keep = Callable[[CommittedReply], Sequence[StoredObject]]
"""What to store of a finished response: its body, its input items, conversation items."""


@dataclass(frozen=True, slots=True)
class ResponseAsk:
    response_id: str
    turn: Turn
    """The input as a turn (its ``items``)."""
    instructions: str | None = None
    previous_id: str | None = None
    conversation_id: str | None = None
    history: tuple[MessageRecord, ...] = ()
    """The conversation's items as messages, for a conversation whose agent cannot be
    forked."""
    history_ids: tuple[str, ...] = ()
    store: bool = True


def response_agent(response_id: str) -> str:
    return f"{INTERNAL_PREFIX}resp:{response_id}"


class ResponsesService:
    def __init__(self, agents: AgentService, objects: ObjectStore) -> None:
        self._agents = agents
        self._objects = objects

    async def create(
        self, namespace: str, ask: ResponseAsk, keep: Keep
    ) -> AsyncGenerator[GenerationEvent, None]:
        """The response's events; the last, a ``CommittedReply``, comes once what ``keep``
        gives is committed (with ``store``), or once the response's agent is gone (without)."""
        agent_id = response_agent(ask.response_id)
        turn = await self._start_chain(namespace, ask, agent_id)
        events = self._agents.send(namespace, agent_id, turn)
        try:
            async with contextlib.aclosing(events):  # its turn lets go of the agent first
                async for event in events:
                    if isinstance(event, CommittedReply) and ask.store:
                        await self._finish(namespace, ask, agent_id, keep(event))
                    elif isinstance(event, CommittedReply):
                        keep(event)
                    yield event
        except BaseException:
            await asyncio.shield(self._drop(namespace, agent_id))
            raise
        if not ask.store:  # once its turn let go of the agent: nothing is kept
            await self._drop(namespace, agent_id)

    async def _finish(
        self, namespace: str, ask: ResponseAsk, agent_id: str, kept: Sequence[StoredObject]
    ) -> None:
        objects = [StoredObject(CHAIN, ask.response_id, agent_id), *kept]
        if ask.conversation_id is not None:
            ids = [*ask.history_ids, *(o.object_id for o in kept if o.kind == ITEM)]
            state = json.dumps({"agent": agent_id, "items": ids})
            objects.append(StoredObject(CONVERSATION_CHAIN, ask.conversation_id, state))
        await self._objects.put_objects(namespace, objects)

    async def _start_chain(self, namespace: str, ask: ResponseAsk, agent_id: str) -> Turn:
        """Fork the agent the response continues (with this response's instructions as its
        system prompt), or make one; the turn to send it."""
        source = await self._source(namespace, ask)
        if source is not None:
            try:
                await self._agents.branch(namespace, source, agent_id, ask.instructions)
            except AgentNotFoundError:
                if ask.previous_id is not None:
                    raise ObjectNotFoundError(
                        "response", ask.previous_id, param="previous_response_id"
                    ) from None
            else:  # this response's instructions only, as OpenAI has it: none carried over
                return ask.turn
        try:
            await self._agents.create(namespace, agent_id, ask.instructions)
        except PromptTooLongError as error:
            raise PromptTooLongError(str(error), param="instructions") from None
        return dataclasses.replace(ask.turn, items=(*ask.history, *ask.turn.items))

    async def _source(self, namespace: str, ask: ResponseAsk) -> str | None:
        if ask.previous_id is not None:
            found = await self._objects.stored_object(namespace, CHAIN, ask.previous_id)
            if found is None:
                raise ObjectNotFoundError("response", ask.previous_id, param="previous_response_id")
            return found.body
        if ask.conversation_id is None:
            return None
        found = await self._objects.stored_object(
            namespace, CONVERSATION_CHAIN, ask.conversation_id
        )
        if found is None:
            return None
        state = json.loads(found.body)
        return str(state["agent"]) if tuple(state["items"]) == ask.history_ids else None

    async def collect_orphans(self) -> int:
        """At start, before any response runs: delete the response agents no stored
        response points at, with the blocks only they held, and say how many. A kill between
        a response's commits (its fork, its turn, what it keeps) or before a ``store: false``
        response's agent was dropped leaves one; nothing can find it again. Assumes no other
        server shares the database meanwhile (its responses in flight would look orphaned)."""
        agents = await self._agents.internal_agents(response_agent(""))
        kept: dict[str, set[str]] = {}
        for namespace in {n for n, _ in agents}:
            chains = await self._objects.objects_of_kind(namespace, CHAIN)
            kept[namespace] = {c.body for c in chains}
        orphans = [(n, a) for n, a in agents if a not in kept[n]]
        for namespace, agent_id in orphans:
            await self._drop(namespace, agent_id)
        return len(orphans)

    async def _drop(self, namespace: str, agent_id: str) -> None:
        with contextlib.suppress(AgentNotFoundError):
            await self._agents.delete(namespace, agent_id)

    async def response(self, namespace: str, response_id: str) -> StoredObject:
        return await self._found(namespace, RESPONSE, response_id, "response")

    async def input_items(self, namespace: str, response_id: str) -> list[StoredObject]:
        await self.response(namespace, response_id)
        return await self._objects.object_children(namespace, INPUT_ITEM, response_id)

    async def delete_response(self, namespace: str, response_id: str) -> None:
        """Its agent goes, and with it the blocks no other response's agent shares."""
        chain = await self._objects.stored_object(namespace, CHAIN, response_id)
        if not await self._objects.delete_objects(namespace, RESPONSE, [response_id]):
            raise ObjectNotFoundError("response", response_id)
        await self._objects.delete_objects(namespace, CHAIN, [response_id])
        if chain is not None:
            await self._drop(namespace, chain.body)

    async def put(self, namespace: str, objects: Sequence[StoredObject]) -> None:
        await self._objects.put_objects(namespace, objects)

    async def conversation(self, namespace: str, conversation_id: str) -> StoredObject:
        return await self._found(namespace, CONVERSATION, conversation_id, "conversation")

    async def conversation_items(self, namespace: str, conversation_id: str) -> list[StoredObject]:
        await self.conversation(namespace, conversation_id)
        return await self._objects.object_children(namespace, ITEM, conversation_id)

    async def delete_conversation(self, namespace: str, conversation_id: str) -> None:
        """Its items go; the responses made in it stay, as OpenAI keeps them."""
        if not await self._objects.delete_objects(namespace, CONVERSATION, [conversation_id]):
            raise ObjectNotFoundError("conversation", conversation_id)
        await self._objects.delete_objects(namespace, CONVERSATION_CHAIN, [conversation_id])

    async def delete_item(self, namespace: str, conversation_id: str, item_id: str) -> None:
        item = await self._objects.stored_object(namespace, ITEM, item_id)
        if item is None or item.parent_id != conversation_id:
            raise ObjectNotFoundError("item", item_id)
        await self._objects.delete_objects(namespace, ITEM, [item_id])

    async def item(self, namespace: str, conversation_id: str, item_id: str) -> StoredObject:
        item = await self._objects.stored_object(namespace, ITEM, item_id)
        if item is None or item.parent_id != conversation_id:
            raise ObjectNotFoundError("item", item_id)
        return item

    async def _found(self, namespace: str, kind: str, object_id: str, what: str) -> StoredObject:
        found = await self._objects.stored_object(namespace, kind, object_id)
        if found is None:
            raise ObjectNotFoundError(what, object_id)
        return found
