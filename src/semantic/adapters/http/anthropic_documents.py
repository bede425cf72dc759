"""Anthropic's ``document`` blocks as the text the model reads.

A user attaches a document with its text (``source.type`` ``text``, plain text, or
``content``, a list of text blocks), a ``title`` and a ``context``; the model here reads
them as text, the title and context first. A PDF or a URL source needs what this server does
not have (a PDF reader, the network) and is refused naming its kind. ``citations`` asks for
a reply citing the document: the reply is plain text here."""

from __future__ import annotations

from typing import Any

from semantic.adapters.http.anthropic_schemas import TextBlock
from semantic.domain.errors import InvalidRequestError


def documents_as_text(blocks: list[TextBlock]) -> list[TextBlock]:
    return [_as_text(block) if block.type == "document" else block for block in blocks]


def _as_text(block: TextBlock) -> TextBlock:
    labels = [label for label in (block.title, block.context) if isinstance(label, str) and label]
    text = "\n\n".join([*labels, _source_text(block.source)])
    return TextBlock(type="text", text=text, cache_control=block.cache_control)


def _source_text(source: Any) -> str:
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "text" and source.get("media_type", "text/plain") == "text/plain":
        data = source.get("data")
        if isinstance(data, str):
            return data
    elif kind == "content":
        content = source.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list) and all(_is_text(part) for part in content):
            return "\n\n".join(part["text"] for part in content)
    else:
        raise InvalidRequestError(
            f"a document's source of type {kind!r} is not supported: only text documents "
            "(source type 'text' with plain text, or 'content' with text blocks)",
            param="messages",
        )
    raise InvalidRequestError(
        f"a document's {kind!r} source needs its text (plain text, or text blocks)",
        param="messages",
    )


def _is_text(part: Any) -> bool:
    return (
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
    )
