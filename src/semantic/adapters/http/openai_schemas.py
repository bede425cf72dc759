"""OpenAI-compatible request bodies. Unknown fields are refused with a 400 naming them.

OpenAI's own fields that this server does not implement are known here all the same, so a
client that sends one at its neutral value (``tools: []``, ``tool_choice: "none"``,
``response_format: {"type": "text"}``) is served, and one that asks for what is missing
is told so by name (``tools are not supported``), not that its field is unknown.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

Metadata = Annotated[
    dict[Annotated[str, msgspec.Meta(max_length=64)], Annotated[str, msgspec.Meta(max_length=512)]],
    msgspec.Meta(max_length=16),
]
"""OpenAI's ``metadata``: at most 16 pairs, keys up to 64 characters, values up to 512."""


class ContentPart(msgspec.Struct, forbid_unknown_fields=True):
    """A content part: text, or an assistant's refusal (its text, sent back as history).
    ``cache_control`` (LiteLLM passes Anthropic's on) changes nothing: every prefix is
    cached here. The other fields belong to kinds of part this server does not take: known,
    so that such a part is refused by naming its kind (``translate.joined_text``)."""

    type: str
    text: str | None = None
    refusal: str | None = None
    cache_control: dict[str, Any] | None = None
    image_url: Any = None
    input_audio: Any = None
    file: Any = None


class ChatMessageIn(msgspec.Struct, forbid_unknown_fields=True):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    refusal: str | None = None
    annotations: list[dict[str, Any]] | None = None
    """With ``refusal``: what OpenAI's SDKs put in a reply's message, which clients send
    back as history (``message.model_dump()``). Neither changes what the model reads."""
    tool_calls: list[dict[str, Any]] | None = None
    function_call: dict[str, Any] | None = None
    audio: dict[str, Any] | None = None
    tool_call_id: str | None = None


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool | None = False
    include_obfuscation: bool | None = None
    """Padding OpenAI adds to stream chunks against side channels; none is added here."""


class SamplingFields(msgspec.Struct, forbid_unknown_fields=True):
    """Fields both endpoints share; ``n`` only at its default."""

    model: str
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    """Not OpenAI's: as vLLM and llama.cpp's servers take it."""
    seed: int | None = None
    n: int | None = None
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    metadata: Metadata | None = None
    """Bookkeeping for the client's own records (as ``user``, ``store``, ``service_tier``
    and ``safety_identifier``): accepted and not acted on. ``prompt_cache_key`` names the
    request's agent where ``X-Agent-Id`` does not, and ``prompt_cache_retention`` sets its
    TTL in memory (``retention_hints``)."""
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None


class ChatCompletionRequest(SamplingFields, forbid_unknown_fields=True):
    messages: list[ChatMessageIn] = msgspec.field(default_factory=list)
    logprobs: bool | None = None
    prediction: dict[str, Any] | None = None
    max_completion_tokens: int | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    """The older name for ``tools`` (as ``function_call`` for ``tool_choice``)."""
    function_call: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    modalities: list[str] | None = None
    reasoning_effort: str | None = None
    audio: dict[str, Any] | None = None
    verbosity: str | None = None
    web_search_options: dict[str, Any] | None = None


class CompletionRequest(SamplingFields, forbid_unknown_fields=True):
    prompt: str | list[Any] = ""
    """Text, a list holding one text, or token ids (a list, or a list holding one)."""
    logprobs: int | None = None
    """An integer here (how many alternatives per token), a flag in chat."""
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None
