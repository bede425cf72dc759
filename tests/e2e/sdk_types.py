"""Plain message dicts as the SDKs' typed parameters: the tests build JSON-like history."""

from __future__ import annotations

from typing import cast

from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionMessageParam


def openai_messages(messages: list[dict[str, str]]) -> list[ChatCompletionMessageParam]:
    return cast(list[ChatCompletionMessageParam], messages)


def anthropic_messages(messages: list[dict[str, str]]) -> list[MessageParam]:
    return cast(list[MessageParam], messages)
