"""Anthropic's document blocks through its SDK: a text document (plain, or text blocks) is
read as text with its title and context, counted in the prompt; a PDF is refused by name."""

from __future__ import annotations

from typing import Any, cast

import anthropic
import pytest
from anthropic.types import MessageParam
from reliability.server import ServerProcess

FACT = "The sky over the planet Zorbu is always green."


def ask(server: ServerProcess, *blocks: Any) -> anthropic.types.Message:
    client = anthropic.Anthropic(base_url=server.url, api_key="unused")
    content = [*blocks, {"type": "text", "text": "Sky colour?"}]
    return client.messages.create(
        model="default",
        max_tokens=8,
        extra_body={"temperature": 0},
        messages=cast("list[MessageParam]", [{"role": "user", "content": content}]),
    )


def test_a_text_document_is_read_with_its_title_and_context(server: ServerProcess) -> None:
    bare = ask(server)
    plain = ask(
        server,
        {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": FACT},
            "title": "Zorbu facts",
            "context": "From the survey.",
            "citations": {"enabled": True},
        },
    )
    blocks = ask(
        server,
        {
            "type": "document",
            "source": {"type": "content", "content": [{"type": "text", "text": FACT}]},
            "title": "Zorbu facts",
            "context": "From the survey.",
        },
    )
    grew = plain.usage.input_tokens + (plain.usage.cache_read_input_tokens or 0)
    before = bare.usage.input_tokens + (bare.usage.cache_read_input_tokens or 0)
    assert grew > before + 10  # the document's words are in the prompt
    both = blocks.usage.input_tokens + (blocks.usage.cache_read_input_tokens or 0)
    assert both == grew  # the same text either way


def test_a_pdf_document_is_refused_naming_its_kind(server: ServerProcess) -> None:
    pdf = {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="},
    }
    with pytest.raises(anthropic.BadRequestError) as refused:
        ask(server, pdf)
    assert "source of type 'base64' is not supported" in str(refused.value)
