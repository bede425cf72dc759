"""OpenAI-compatible request bodies. Unknown fields are refused with a 400 naming them."""

from __future__ import annotations

import msgspec


class ContentPart(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    text: str | None = None


class ChatMessageIn(msgspec.Struct, forbid_unknown_fields=True):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool = False


class SamplingFields(msgspec.Struct, forbid_unknown_fields=True):
    """Fields both endpoints share; ``n``, penalties and logprobs only at their defaults."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    n: int | None = None
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: bool | None = None


class ChatCompletionRequest(SamplingFields, forbid_unknown_fields=True):
    messages: list[ChatMessageIn] = msgspec.field(default_factory=list)
    max_completion_tokens: int | None = None


class CompletionRequest(SamplingFields, forbid_unknown_fields=True):
    prompt: str | list[str] = ""
