"""Bodies of the stateful agents API."""

from __future__ import annotations

import msgspec


class CreateAgent(msgspec.Struct, forbid_unknown_fields=True):
    id: str
    system_prompt: str | None = None
    namespace: str | None = None


class ForkAgent(msgspec.Struct, forbid_unknown_fields=True):
    id: str


class SendMessage(msgspec.Struct, forbid_unknown_fields=True):
    content: str
    stream: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
