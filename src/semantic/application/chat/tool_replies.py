"""Reading a reply that may call tools, as it streams: the text before the first call is
passed on at once, and each call as it forms (its name once its head is written, then its
arguments as they come), the way OpenAI's and Anthropic's streams show a call forming.

A call is read with the format's head and tail (``ToolFormat``) around a JSON object whose
end this reader finds itself, one character at a time, so a long call costs one pass. A
later call that repeats an earlier one (same tool, same arguments, written alike) is held
while it could still be that repeat and dropped if it is: the grammar ends a reply at
such a repeat (ADR 0018), and a client never sees it. A reply cut short inside a call
(``max_tokens``) keeps the call as far as it came, arguments incomplete, as OpenAI's does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from semantic.application.engine.generation_handle import GenerationResult, TextDelta
from semantic.domain.tools import ToolCall
from semantic.ports.tool_format import ToolFormat


@dataclass(frozen=True, slots=True)
class Call:
    id: str
    name: str
    arguments: str
    complete: bool = True
    """False for a call cut short: ``arguments`` is then the JSON text as far as it came."""

    def as_tool_call(self) -> ToolCall:
        return ToolCall(self.id, self.name, self.arguments)


@dataclass(frozen=True, slots=True)
class CallOpened:
    """Call ``index`` of the reply began: its id and tool are known, no arguments yet."""

    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ArgumentsDelta:
    index: int
    text: str


ReplyEvent = TextDelta | CallOpened | ArgumentsDelta
TurnEvent = ReplyEvent | GenerationResult
"""What a turn that may call tools reports: the reply's text and calls as they form, and
last its result."""


@dataclass(frozen=True, slots=True)
class Reply:
    content: str
    """The text before the calls (all of it where there are none)."""
    calls: tuple[Call, ...]
    raw: str
    """Everything the model wrote, to render this turn again exactly as it was generated."""
    cut: bool = False
    """The generation stopped at a limit (``max_tokens``) once its calls had begun."""

    @property
    def generated(self) -> str | None:
        """``raw`` where the client was shown all of it; None where a limit cut the calls
        (the text after the last call shown was dropped, or a call never reached its end):
        the next turn then renders this one from what the client sends back, as a cold run
        of the conversation does, never from text the client was not shown."""
        return None if self.cut_in_a_call else self.raw

    @property
    def cut_in_a_call(self) -> bool:
        """Its calls were cut short: a call it shows is incomplete, or the limit came after
        its whole calls (in a further call, never shown, or a held repeat). Its finish is
        then the limit's (``length``, ``max_tokens``, Responses ``incomplete``), as OpenAI's
        and Anthropic's are: a client learns that more may have followed. A repeat the
        grammar ended is no limit: that reply ends in its whole calls."""
        return self.cut or any(not call.complete for call in self.calls)


class _Forming:
    """One call being read: where its arguments start, how far their JSON was scanned."""

    def __init__(self, name: str, arguments_at: int) -> None:
        self.name = name
        self.start = arguments_at
        self.end: int | None = None
        self.scanner = JsonExtent()
        self.index: int | None = None
        """Its place among the calls shown; None while held back or dropped."""
        self.id = ""
        self.shown = arguments_at


class ReplyReader:
    """``fmt`` None: plain text, passed on as it comes."""

    def __init__(self, fmt: ToolFormat | None, new_id: Callable[[], str]) -> None:
        self._fmt = fmt
        self._new_id = new_id
        self._raw = ""
        self._shown = 0
        self._call_at: int | None = None
        self._next = 0
        """Where the next call's head is looked for (after the last complete call)."""
        self._forming: _Forming | None = None
        self._calls: list[Call] = []

    @property
    def reads_calls(self) -> bool:
        return self._fmt is not None

    def feed(self, text: str) -> list[ReplyEvent]:
        """What to pass on now."""
        self._raw += text
        fmt = self._fmt
        if fmt is None:
            return self._text(len(self._raw))
        events: list[ReplyEvent] = []
        if self._call_at is None:
            events = self._before_calls(fmt.trigger)
            if self._call_at is None:
                return events
        return events + self._read_calls(fmt)

    def finish(self, *, cut: bool = False) -> tuple[list[ReplyEvent], Reply]:
        """What is still to pass on, and the reply. ``cut``: the generation stopped at a
        limit; a call it cut before its tool's name is then dropped, never shown as text
        (without a limit, a trigger that began no call was the model's own text)."""
        forming = self._forming
        if forming is not None and forming.index is not None:  # cut short inside it
            end = len(self._raw) if forming.end is None else forming.end
            arguments = self._raw[forming.start : end]
            self._calls.append(Call(forming.id, forming.name, arguments, forming.end is not None))
        if self._call_at is None or not (self._calls or cut):  # no call began: all text
            return self._text(len(self._raw)), Reply(self._raw, (), self._raw)
        content = self._raw[: self._call_at].rstrip()
        return [], Reply(content, tuple(self._calls), self._raw, cut=cut)

    def _before_calls(self, trigger: str) -> list[ReplyEvent]:
        found = self._raw.find(trigger, self._shown)
        if found < 0:
            held = _partial_suffix(self._raw, trigger)
            return self._text(len(self._raw[: len(self._raw) - held].rstrip()))
        self._call_at = self._next = found
        return self._text(len(self._raw[:found].rstrip()))

    def _read_calls(self, fmt: ToolFormat) -> list[ReplyEvent]:
        events: list[ReplyEvent] = []
        while True:
            if self._forming is None:
                head = fmt.read_head(self._raw, self._next)
                if head is None:
                    return events
                self._forming = _Forming(head.name, head.arguments_at)
            forming = self._forming
            if forming.end is None:
                forming.end = forming.scanner.scan(self._raw, forming.start)
            events += self._show(forming)
            if forming.end is None:
                return events
            after = fmt.read_tail(self._raw, forming.end)
            if after is None:
                return events
            self._complete(forming)
            self._forming, self._next = None, after

    def _show(self, forming: _Forming) -> list[ReplyEvent]:
        end = len(self._raw) if forming.end is None else forming.end
        if forming.index is None:
            if self._may_repeat(forming, self._raw[forming.start : end]):
                return []
            forming.index = len(self._calls)
            forming.id = self._new_id()
            opened: list[ReplyEvent] = [CallOpened(forming.index, forming.id, forming.name)]
        else:
            opened = []
        text, forming.shown = self._raw[forming.shown : end], end
        return opened + ([ArgumentsDelta(forming.index, text)] if text else [])

    def _may_repeat(self, forming: _Forming, arguments: str) -> bool:
        earlier = (c.arguments for c in self._calls if c.name == forming.name)
        return any(text.startswith(arguments) for text in earlier)

    def _complete(self, forming: _Forming) -> None:
        if forming.index is None:
            return  # a repeat of an earlier call, ended there by the grammar
        arguments = self._raw[forming.start : forming.end]
        self._calls.append(Call(forming.id, forming.name, arguments))

    def _text(self, upto: int) -> list[ReplyEvent]:
        upto = max(upto, self._shown)
        text = self._raw[self._shown : upto]
        self._shown = upto
        return [TextDelta(text)] if text else []


class JsonExtent:
    """Where a JSON value that starts with ``{`` or ``[`` ends, found in pieces: each
    ``scan`` continues from where the last one stopped."""

    def __init__(self) -> None:
        self._at: int | None = None
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def scan(self, text: str, start: int) -> int | None:
        """The index just past the value, or None while ``text`` holds only part of it."""
        begin = start if self._at is None else self._at
        for position in range(begin, len(text)):
            if self._step(text[position]):
                self._at = position + 1
                return position + 1
        self._at = len(text)
        return None

    def _step(self, char: str) -> bool:
        if self._in_string:
            if self._escaped:
                self._escaped = False
            elif char == "\\":
                self._escaped = True
            elif char == '"':
                self._in_string = False
            return False
        if char == '"':
            self._in_string = True
        elif char in "{[":
            self._depth += 1
        elif char in "}]":
            self._depth -= 1
            return self._depth == 0
        return False


def _partial_suffix(text: str, trigger: str) -> int:
    """How many of ``text``'s last characters could be the start of ``trigger``."""
    for size in range(min(len(trigger) - 1, len(text)), 0, -1):
        if trigger.startswith(text[-size:]):
            return size
    return 0
