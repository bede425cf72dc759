"""The tokenizer port: text to token ids and back, and the model's chat template."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from semantic.domain.chat import ChatMessage
from semantic.domain.tools import Tool
from semantic.ports.tool_format import ToolFormat


class Tokenizer(Protocol):
    """What the application needs from a tokenizer.

    ``decode`` must be a pure function of the ids (no state between calls), so streaming
    detokenization and stop-string cutting can re-decode any window of ids.
    """

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Ids that end the assistant's turn (for the chat models: ``<|im_end|>``)."""
        ...

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` with no special tokens added. May raise ``PromptTooLongError``
        for a text certainly too long for the model's context, without tokenizing it (as
        may ``render_chat``)."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of text one token stands for: its decoding's where it holds whole
        characters, the part's where it holds part of one (which decodes alone to U+FFFD)."""
        ...

    def render_chat(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        scope: str = "",
        continue_final: bool = False,
        tools: Sequence[Tool] = (),
        known: Sequence[int] = (),
    ) -> list[int]:
        """Token ids of ``messages`` rendered with the model's chat template. What a
        tokenizer remembers between calls to go faster stays within ``scope`` (the
        namespace), so one tenant's text never makes another's request measurably faster.
        ``continue_final``: the last message (the assistant's) is left open, for the reply
        to continue it. ``tools`` are listed as the model's tool format lists them
        (``tool_format``); messages with calls and tool results are rendered in it too.
        ``known``: ids an earlier ``render_chat`` of this tokenizer gave in ``scope`` (any
        prefix of them, such as a chain's previous prompt read from its stored blocks), which
        this rendering may take the ids of text it repeats from rather than tokenize it
        again; the ids returned are the same either way."""
        ...

    @property
    def tool_format(self) -> ToolFormat:
        """How this model writes tool calls (ADR 0018)."""
        ...
