"""Every response names its request: ``x-request-id`` (OpenAI's header) and ``request-id``
(Anthropic's), which each SDK shows as the response's ``_request_id`` and a user quotes
when reporting what went wrong. Stamped at the edge, so its own refusals carry one too."""

from __future__ import annotations

import uuid

from litestar.types import Message, Send


def with_request_id(send: Send) -> Send:
    """``send`` that adds a new id to the response's headers as it starts."""
    said = f"req_{uuid.uuid4().hex[:24]}".encode()

    async def stamped(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [*message.get("headers", ()), (b"x-request-id", said), (b"request-id", said)]
            message = {**message, "headers": headers}
        await send(message)

    return stamped
