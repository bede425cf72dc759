"""Calls written as a JSON object ``{"name": ..., "arguments": {...}}`` between two tags:
the shape the default format and the Hermes-style templates (Qwen 2.5/3, Hermes) share,
and, with other tags and key, Mistral's and Llama 3's. One class, parameterized by the
tags, so each format module only says which tags and how its prompt is rendered."""

from __future__ import annotations

import json
import re

from semantic.domain.constraints import OutputConstraint, TaggedSchema
from semantic.domain.tools import MAX_CALLS_PER_REPLY, CallHead, ToolUse

_SPACE = re.compile(r"\s*")
_CLOSE_OBJECT = re.compile(r"\s*\}")


class JsonCallFormat:
    """``open_tag`` + ``{"name": "<tool>", "<arguments_key>": <arguments>}`` + ``close_tag``,
    calls one after another with whitespace between. ``trigger`` is where a call starts in
    a reply: ``open_tag`` without its whitespace, or (a format without tags) the start of
    the JSON object itself."""

    def __init__(
        self,
        name: str,
        open_tag: str,
        close_tag: str,
        *,
        arguments_key: str = "arguments",
        trigger: str | None = None,
        one_call: bool = False,
    ) -> None:
        """``one_call``: a reply holds one call at most, parallel calls asked or not (a
        template that refuses a history of several, as Llama 3.1's does)."""
        self._name = name
        self._one_call = one_call
        self.open_tag = open_tag
        self.close_tag = close_tag
        self.arguments_key = arguments_key
        self._trigger = trigger or open_tag.strip()
        key = re.escape(json.dumps(arguments_key))
        name = r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*'
        self._head = re.compile(name + key + r"\s*:\s*(?=\S)")  # the arguments' first character

    @property
    def name(self) -> str:
        return self._name

    @property
    def trigger(self) -> str:
        return self._trigger

    def begin(self, tool: str) -> str:
        return f'{self.open_tag}{{"name": {json.dumps(tool)}, {json.dumps(self.arguments_key)}: '

    @property
    def end(self) -> str:
        return "}" + self.close_tag

    def call_text(self, name: str, arguments: str) -> str:
        """A call as this format writes it (for history the model did not write here)."""
        return self.begin(name) + arguments + self.end

    def constraint(self, use: ToolUse) -> OutputConstraint | None:
        """Parallel calls: any offered tool, up to ``MAX_CALLS_PER_REPLY`` calls, and a call
        identical to an earlier one ends the reply (a small model, once free to add a call,
        tends to repeat the last one until ``max_tokens``; ADR 0018)."""
        offered = use.offered
        if not offered:
            return None
        return OutputConstraint(
            calls=tuple(TaggedSchema(self.begin(t.name), t.call_schema, self.end) for t in offered),
            triggers=(self._trigger,),
            require_call=use.must_call,
            max_calls=MAX_CALLS_PER_REPLY if use.parallel and not self._one_call else 1,
            end_on_repeat=True,
        )

    def read_head(self, text: str, start: int) -> CallHead | None:
        position = _skip_space(text, start)
        opening = self.open_tag.strip()
        if not text.startswith(opening, position):
            return None
        head = self._head.match(text, _skip_space(text, position + len(opening)))
        if head is None:
            return None
        try:
            name = json.loads(head.group(1))
        except ValueError:
            return None
        return CallHead(name, head.end())

    def read_tail(self, text: str, start: int) -> int | None:
        closing = _CLOSE_OBJECT.match(text, start)
        if closing is None:
            return None
        after = _skip_space(text, closing.end())
        tag = self.close_tag.strip()
        if not tag:
            return closing.end()
        return after + len(tag) if text.startswith(tag, after) else None


def _skip_space(text: str, position: int) -> int:
    match = _SPACE.match(text, position)
    return match.end() if match else position
