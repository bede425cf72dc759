"""Reading a reply that may call tools, as it streams: the text before the first call is
passed on at once; from the call's first character on, everything is held until the reply
ends, so a client never sees half a call. A reply cut short inside a call (``max_tokens``)
is then its text, whole, and no call (issue 34: never a half ``tool_calls`` entry)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from semantic.domain.tools import ToolCall
from semantic.ports.tool_format import ToolFormat


@dataclass(frozen=True, slots=True)
class Call:
    id: str
    name: str
    arguments: str
    pieces: tuple[str, ...]
    """``arguments`` cut where the model's text came in, to stream it as it came."""

    def as_tool_call(self) -> ToolCall:
        return ToolCall(self.id, self.name, self.arguments)


@dataclass(frozen=True, slots=True)
class Reply:
    content: str
    """The text before the calls (all of it where there are none)."""
    calls: tuple[Call, ...]
    raw: str
    """Everything the model wrote, to render this turn again exactly as it was generated."""


class ReplyReader:
    """``fmt`` None: plain text, passed on as it comes."""

    def __init__(self, fmt: ToolFormat | None, new_id: Callable[[], str]) -> None:
        self._fmt = fmt
        self._new_id = new_id
        self._raw = ""
        self._cuts = [0]
        self._shown = 0
        self._call_at: int | None = None

    @property
    def reads_calls(self) -> bool:
        return self._fmt is not None

    def feed(self, text: str) -> str:
        """The text to pass on now."""
        self._raw += text
        self._cuts.append(len(self._raw))
        if self._fmt is None:
            self._shown = len(self._raw)
            return text
        if self._call_at is not None:
            return ""
        trigger = self._fmt.trigger
        found = self._raw.find(trigger, self._shown)
        if found >= 0:
            self._call_at = found
            return self._show(len(self._raw[:found].rstrip()))
        held = _partial_suffix(self._raw, trigger)
        return self._show(len(self._raw[: len(self._raw) - held].rstrip()))

    def finish(self) -> tuple[str, Reply]:
        """The text still to pass on, and the reply."""
        raw = self._raw
        calls = self._calls()
        if not calls:
            return self._show(len(raw)), Reply(raw, (), raw)
        assert self._call_at is not None
        return "", Reply(raw[: self._call_at].rstrip(), calls, raw)

    def _calls(self) -> tuple[Call, ...]:
        if self._fmt is None or self._call_at is None:
            return ()
        found = self._fmt.parse_calls(self._raw[self._call_at :])
        if found is None:
            return ()
        out = []
        for parsed in found:
            start, end = self._call_at + parsed.start, self._call_at + parsed.end
            cuts = sorted({start, end, *(c for c in self._cuts if start < c < end)})
            pieces = tuple(self._raw[a:b] for a, b in itertools.pairwise(cuts))
            out.append(Call(self._new_id(), parsed.name, parsed.arguments, pieces))
        return tuple(out)

    def _show(self, upto: int) -> str:
        upto = max(upto, self._shown)
        text = self._raw[self._shown : upto]
        self._shown = upto
        return text


def _partial_suffix(text: str, trigger: str) -> int:
    """How many of ``text``'s last characters could be the start of ``trigger``."""
    for size in range(min(len(trigger) - 1, len(text)), 0, -1):
        if trigger.startswith(text[-size:]):
            return size
    return 0
