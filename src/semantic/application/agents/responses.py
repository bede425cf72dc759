"""The Responses API's chains and conversations on the stateful agents use case (ADR 0020).

Every stored response owns an internal agent (``~resp:<id>``). A response on
``previous_response_id`` generates from the previous response's transcript and blocks, and
its agent, a branch of the previous one (every block shared, no KV copied), is made with
its reply in one transaction (nothing is written before generation starts), so two
responses on one previous id branch copy-on-write, and deleting a response frees only what
its agent alone held. A response's ``instructions`` are its own
system prompt: as at OpenAI, a previous response's are not carried over. A
conversation remembers the agent of its last response and the items it had then; a response
with ``conversation`` branches from that agent while the items are unchanged, else starts
one from the items. What a response keeps (its body, its items) commits in one transaction before
the client is told it completed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass

from semantic.application.agents.service import AgentService
from semantic.application.agents.values import INTERNAL_PREFIX, CommittedReply, Turn, TurnStarted
from semantic.application.chat.tool_replies import TurnEvent
from semantic.domain.errors import AgentNotFoundError, ObjectNotFoundError, PromptTooLongError
from semantic.ports.metadata_store import AgentRecord, MessageRecord
from semantic.ports.object_store import ObjectStore, StoredObject

RESPONSE = "response"
INPUT_ITEM = "input_item"
CHAIN = "chain"
"""A response's agent and its prompt's mark (``chain_body``; a bare agent id before marks)."""
CONVERSATION = "conversation"
ITEM = "item"
CONVERSATION_CHAIN = "conversation_chain"
"""A conversation's last response's agent, the item ids it had then and its prompt's mark
(JSON)."""

ResponseEvent = TurnEvent | TurnStarted
"""What a response's generation gives: ``TurnStarted`` once queued, its text, its reply."""

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
    truncate: bool = False
    """``truncation: "auto"``: a chain that leaves the input no room loses its oldest
    turns, and the chain after it continues from the shortened one."""
    retention: str | None = None
    """``prompt_cache_retention`` (or ``X-Retention``) as the response's agent's hints
    (JSON); each response says its own, as OpenAI's parameter is per request."""


def response_agent(response_id: str) -> str:
    return f"{INTERNAL_PREFIX}resp:{response_id}"


def chain_body(agent_id: str, rendered: str) -> str:
    return json.dumps({"agent": agent_id, "rendered": rendered})


def chain_of(body: str) -> tuple[str, str]:
    """A chain row's agent and prompt mark; a row stored before marks is the bare agent id
    (internal ids start with ``INTERNAL_PREFIX``, never ``{``)."""
    if not body.startswith("{"):
        return body, ""
    state = json.loads(body)
    return str(state["agent"]), str(state.get("rendered", ""))


Continued = tuple[AgentRecord, list[MessageRecord], str]
"""The agent a response continues, its transcript and its prompt's mark."""


class ResponsesService:
    def __init__(self, agents: AgentService, objects: ObjectStore) -> None:
        self._agents = agents
        self._objects = objects

    async def create(
        self, namespace: str, ask: ResponseAsk, keep: Keep
    ) -> AsyncGenerator[ResponseEvent, None]:
        """The response's events: ``TurnStarted`` once it is queued, and last a
        ``CommittedReply``, once what ``keep`` gives is committed (with ``store``), or once
        the response's agent is gone (without)."""
        agent_id = response_agent(ask.response_id)
        agent, history, turn, rendered = await self._chain(namespace, ask, agent_id)
        events = self._agents.send_new(
            agent, history, turn, keep=ask.store, rendered=rendered, truncate=ask.truncate
        )
        try:
            async with contextlib.aclosing(events):  # its turn lets go of the agent first
                async for event in events:
                    if isinstance(event, CommittedReply) and ask.store:
                        await self._finish(namespace, ask, agent_id, keep(event), event)
                    elif isinstance(event, CommittedReply):
                        keep(event)
                    yield event
        except PromptTooLongError as error:
            await asyncio.shield(self._drop(namespace, agent_id))
            if error.param != "system_prompt":
                raise
            raise PromptTooLongError(str(error), param="instructions") from None
        except BaseException:
            await asyncio.shield(self._drop(namespace, agent_id))
            raise
        if not ask.store:  # once its turn let go of the agent: what a save made goes
            await self._drop(namespace, agent_id)

    async def input_tokens(self, namespace: str, ask: ResponseAsk) -> int:
        """How many tokens the response's prompt would hold, its chain read as ``create``
        reads it; nothing is run or written."""
        agent, history, turn, _ = await self._chain(namespace, ask, response_agent(ask.response_id))
        return self._agents.prompt_tokens(agent, history, turn)

    async def _finish(
        self,
        namespace: str,
        ask: ResponseAsk,
        agent_id: str,
        kept: Sequence[StoredObject],
        reply: CommittedReply,
    ) -> None:
        """The response, its items and chain, under the lease its turn committed under."""
        rendered = reply.rendered
        objects = [StoredObject(CHAIN, ask.response_id, chain_body(agent_id, rendered)), *kept]
        if ask.conversation_id is not None:
            ids = [*ask.history_ids, *(o.object_id for o in kept if o.kind == ITEM)]
            state = json.dumps({"agent": agent_id, "items": ids, "rendered": rendered})
            objects.append(StoredObject(CONVERSATION_CHAIN, ask.conversation_id, state))
        await self._objects.put_objects(namespace, objects, lease=reply.lease)

    async def _chain(
        self, namespace: str, ask: ResponseAsk, agent_id: str
    ) -> tuple[AgentRecord, list[MessageRecord], Turn, str]:
        """The response's agent, not yet made (``AgentService.send_new``): a branch of the
        agent it continues (its blocks shared, its messages as the history, this
        response's instructions as its system prompt: none are carried over, as OpenAI has
        it), or a new one; its history, the turn to send it and the mark of the prompt its
        blocks start with."""
        new = AgentRecord(
            namespace,
            agent_id,
            system_prompt=ask.instructions,
            keeps_transcript=True,
            retention=ask.retention,
        )
        found = await self._continued(namespace, ask)
        if found is None:
            turn = dataclasses.replace(ask.turn, items=(*ask.history, *ask.turn.items))
            return new, [], turn, ""
        record, history, rendered = found
        branch = dataclasses.replace(
            new, block_keys=record.block_keys, token_count=record.token_count
        )
        return branch, history, ask.turn, rendered

    async def _continued(self, namespace: str, ask: ResponseAsk) -> Continued | None:
        """The agent the response continues, with its transcript: the previous response's,
        or the conversation's while its items are unchanged (else None)."""
        if ask.previous_id is not None:
            return await self._previous(namespace, ask.previous_id)
        if ask.conversation_id is None:
            return None
        found = await self._objects.stored_object(
            namespace, CONVERSATION_CHAIN, ask.conversation_id
        )
        if found is None:
            return None
        state = json.loads(found.body)
        if tuple(state["items"]) != ask.history_ids:
            return None
        rendered = str(state.get("rendered", ""))
        return await self._transcript(namespace, str(state["agent"]), rendered)

    async def _previous(self, namespace: str, previous_id: str) -> Continued:
        """The previous response's agent and transcript: two reads (its chain row, then the
        agent with its messages on one connection) and nothing written."""
        chain = await self._objects.stored_object(namespace, CHAIN, previous_id)
        found = None if chain is None else await self._transcript(namespace, *chain_of(chain.body))
        if found is None:
            raise ObjectNotFoundError("response", previous_id, param="previous_response_id")
        return found

    async def _transcript(self, namespace: str, agent_id: str, rendered: str) -> Continued | None:
        try:
            record, history = await self._agents.transcript(namespace, agent_id)
        except AgentNotFoundError:
            return None
        return record, history, rendered

    async def collect_orphans(self) -> int:
        """At start, before any response runs: delete the response agents no stored
        response points at, with the blocks only they held, and say how many. A kill between
        a response's commits (the save of its blocks, which makes its agent's row when it
        comes first; its agent with its turn; what it keeps) or before a ``store: false``
        response's agent was dropped leaves one; nothing can find it again. Assumes no other
        server shares the database meanwhile (its responses in flight would look orphaned)."""
        agents = await self._agents.internal_agents(response_agent(""))
        kept: dict[str, set[str]] = {}
        for namespace in {n for n, _ in agents}:
            chains = await self._objects.objects_of_kind(namespace, CHAIN)
            kept[namespace] = {chain_of(c.body)[0] for c in chains}
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
            await self._drop(namespace, chain_of(chain.body)[0])

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
