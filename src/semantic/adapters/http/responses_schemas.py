"""The Responses and Conversations APIs' request bodies. Unknown fields are refused naming
them; OpenAI's fields this server does not serve are known, so one sent at its neutral value
is fine and one asking for more is refused by name (``responses_routes``)."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from semantic.adapters.http.openai_schemas import Metadata

Items = Annotated[list[Any], msgspec.Meta(max_length=20)]
"""Items added to a conversation at once: at most 20, as OpenAI takes them."""


class ResponseRequest(msgspec.Struct, forbid_unknown_fields=True):
    model: str | None = None
    input: str | list[Any] = ""
    instructions: str | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    store: bool | None = True
    stream: bool | None = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    metadata: Metadata | None = None
    background: bool | None = None
    truncation: str | None = None
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None
    prompt: dict[str, Any] | None = None
    stream_options: dict[str, Any] | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    """Every chain is cached here; these change nothing."""
    context_management: list[Any] | None = None


class InputTokensRequest(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /v1/responses/input_tokens``: the fields of a response that make its prompt."""

    model: str | None = None
    input: str | list[Any] = ""
    instructions: str | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    truncation: str | None = None
    reasoning: dict[str, Any] | None = None
    personality: str | None = None
    """A style preset of OpenAI's models; as ``reasoning``, it changes no count here."""

    def as_response(self) -> ResponseRequest:
        """The response these fields would make, read by the same checks."""
        fields = msgspec.structs.asdict(self)
        del fields["personality"]
        return ResponseRequest(**fields)


class CreateConversation(msgspec.Struct, forbid_unknown_fields=True):
    items: Items | None = None
    metadata: Metadata | None = None


class UpdateConversation(msgspec.Struct, forbid_unknown_fields=True):
    metadata: Metadata | None = None


class AddItems(msgspec.Struct, forbid_unknown_fields=True):
    items: Items
