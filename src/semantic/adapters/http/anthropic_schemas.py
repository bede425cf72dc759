"""Anthropic-compatible request bodies."""

from __future__ import annotations

from typing import Any

import msgspec


class TextBlock(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """A content block. Text is read, and a text document as text (``anthropic_documents``);
    ``cache_control`` (every prefix is cached here anyway) and ``citations`` (a reply's
    sources sent back with it as history, or a document's ``{"enabled": true}``) do not
    change what the model reads. The other fields belong to kinds of block this server
    reads only in their places (tool use and results) or not at all (images, thinking):
    known, so that such a block is refused by naming its kind, not an odd field."""

    type: str
    text: str | None = None
    cache_control: dict[str, Any] | None = None
    citations: list[dict[str, Any]] | dict[str, Any] | None = None
    id: Any = None
    name: Any = None
    input: Any = None
    tool_use_id: Any = None
    content: Any = None
    is_error: Any = None
    source: Any = None
    title: Any = None
    context: Any = None
    thinking: Any = None
    signature: Any = None
    data: Any = None
    caller: Any = None
    toolset_name: Any = None
    """Of a ``tool_use`` block: Anthropic's SDKs dump them, null, with the block."""
    tool: Any = None
    """Of a ``tool_addition`` or ``tool_removal`` block (tools changed mid-conversation)."""


class AnthropicMessage(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    role: str
    content: str | list[TextBlock]


class PlainChat(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Fields for features this server does not have, known so that their neutral values
    (``tools: []``, ``tool_choice: {"type": "none"}``, ``thinking: {"type": "disabled"}``)
    are served and any other is refused by name (``_check_plain_chat``)."""

    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    thread: dict[str, Any] | None = None


class CountTokensRequest(PlainChat, forbid_unknown_fields=True):
    model: str
    messages: list[AnthropicMessage]
    system: str | list[TextBlock] | None = None
    context_management: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None


class MessagesRequest(PlainChat, forbid_unknown_fields=True):
    model: str
    max_tokens: int
    messages: list[AnthropicMessage]
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None
    service_tier: str | None = None
    inference_geo: str | None = None
    speed: str | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None
    """Routing and accounting fields: accepted, with no effect on the reply. Other features
    we do not have are refused as unknown fields."""
    output_config: dict[str, Any] | None = None
    """Structured output (``format``: a JSON Schema the reply's text matches)."""
    context_management: dict[str, Any] | None = None
    """Context edits (``clear_tool_uses_20250919``), read by ``anthropic_context``."""
