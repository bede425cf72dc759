"""Anthropic's message threads (its ``message-threads`` beta): a conversation held under
each reply's id, so that a client continues it sending only its new messages, as a
Responses chain continues by ``previous_response_id``. What is held is what the next turn
needs of the request (its system prompt, tools and messages, the reply last), as JSON the
front door writes and reads; the KV behind it is found again by its prompt, as every
conversation's is. A thread moves on as it is continued: the reply it continued is let go,
so a thread holds its conversation once (Anthropic's threads are as linear: a reply
continued twice is refused there too)."""

from __future__ import annotations

from semantic.domain.errors import ObjectNotFoundError
from semantic.ports.object_store import ObjectStore, StoredObject

THREAD = "message_thread"
THREAD_PARAM = "thread.previous_message_id"
"""The field a lost thread's refusal names (the edge maps it to Anthropic's code)."""


class MessageThreads:
    def __init__(self, objects: ObjectStore) -> None:
        self._objects = objects

    async def hold(
        self, namespace: str, message_id: str, state: str, *, moves_on: str | None = None
    ) -> None:
        """The conversation up to and with the reply ``message_id``, to be continued;
        ``moves_on``: the reply it continued, let go now that the thread holds the whole
        conversation under its new reply (one copy a thread, not one a turn)."""
        await self._objects.put_objects(namespace, [StoredObject(THREAD, message_id, state)])
        if moves_on is not None:
            await self._objects.delete_objects(namespace, THREAD, [moves_on])

    async def held(self, namespace: str, message_id: str) -> str:
        """The conversation a reply ends, as ``hold`` was given it."""
        found = await self._objects.stored_object(namespace, THREAD, message_id)
        if found is None:
            raise ObjectNotFoundError("message thread", message_id, param=THREAD_PARAM)
        return found.body
