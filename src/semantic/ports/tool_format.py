"""A model's tool-call format: how a call is written, what constrains a reply to it, and
reading calls back out of a reply. How tools are rendered into the prompt belongs to the
tokenizer (``Tokenizer.render_chat(..., tools=...)``), which owns the chat template."""

from __future__ import annotations

from typing import Protocol

from semantic.domain.constraints import OutputConstraint
from semantic.domain.tools import CallHead, ToolUse


class ToolFormat(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def trigger(self) -> str:
        """The text that starts a call: what comes before it is the reply's text."""
        ...

    def constraint(self, use: ToolUse) -> OutputConstraint | None:
        """What the reply must look like to call ``use``'s tools as it allows; None when
        it may not call any (``tool_choice`` none)."""
        ...

    def read_head(self, text: str, start: int) -> CallHead | None:
        """The call whose text begins at ``start`` (after any whitespace): its tool and
        where its arguments' JSON begins; None while ``text`` holds no whole head there."""
        ...

    def read_tail(self, text: str, start: int) -> int | None:
        """Where the call whose arguments end at ``start`` ends, past its closing text;
        None while ``text`` holds no whole closing there."""
        ...
