"""What the model wrote when it called tools, kept so the next turn renders it again token
for token (issue 34 item 6, ADR 0018).

An agent loop sends the assistant's calls back as JSON (OpenAI's ``arguments`` string,
Anthropic's ``input`` object, re-serialized by the client with its own spacing and key
order). Rendered from that JSON, the turn would differ from what was generated, and the
cached prefix would end there. So each reply with calls is kept, by its first call's id,
in the metadata store (durable: it holds across a restart); a history message whose calls
are the same calls (same ids, names, and arguments as JSON values) is rendered as the text
that was generated.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from semantic.application.chat.tool_replies import Reply
from semantic.domain.chat import ChatMessage
from semantic.domain.tools import same_arguments
from semantic.ports.metadata_store import ReplyMemory


class CallMemory:
    def __init__(self, replies: ReplyMemory) -> None:
        self._replies = replies

    async def remember(self, namespace: str, reply: Reply) -> None:
        if not reply.calls or reply.generated is None:
            return
        body = {
            "raw": reply.generated,
            "content": reply.content,
            "calls": [[c.id, c.name, c.arguments] for c in reply.calls],
        }
        await self._replies.remember_reply(namespace, reply.calls[0].id, json.dumps(body))

    async def restore(self, namespace: str, messages: Sequence[ChatMessage]) -> list[ChatMessage]:
        """``messages`` with each assistant turn of calls this server generated (and the
        client did not change) as the text that was generated."""
        out = []
        for message in messages:
            raw = await self._generated(namespace, message) if message.tool_calls else None
            out.append(message if raw is None else ChatMessage("assistant", raw))
        return out

    async def _generated(self, namespace: str, message: ChatMessage) -> str | None:
        stored = await self._replies.remembered_reply(namespace, message.tool_calls[0].id)
        if stored is None:
            return None
        body: dict[str, Any] = json.loads(stored)
        calls = body["calls"]
        if len(calls) != len(message.tool_calls):
            return None
        for (call_id, name, arguments), call in zip(calls, message.tool_calls, strict=True):
            if call.id != call_id or call.name != name:
                return None
            if not same_arguments(call.arguments, arguments):
                return None
        if message.content.strip() != str(body["content"]).strip():
            return None
        return str(body["raw"])
