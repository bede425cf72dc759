"""Calls written as a JSON object ``{"name": ..., "arguments": {...}}`` between two tags:
the shape the default format and the Hermes-style templates (Qwen 2.5/3, Hermes) share,
and, with other tags and key, Mistral's and Llama 3's. One class, parameterized by the
tags, so each format module only says which tags and how its prompt is rendered."""

from __future__ import annotations

import json
import re

from semantic.domain.constraints import OutputConstraint, TaggedSchema
from semantic.domain.tools import ParsedCall, ToolUse

_DECODER = json.JSONDecoder()
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
    ) -> None:
        self._name = name
        self.open_tag = open_tag
        self.close_tag = close_tag
        self.arguments_key = arguments_key
        self._trigger = trigger or open_tag.strip()
        key = re.escape(json.dumps(arguments_key))
        self._head = re.compile(r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*' + key + r"\s*:\s*")

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
        """Parallel calls are bounded by the number of tools offered: a small model, once
        free to add a call, tends to repeat the last one until ``max_tokens`` (ADR 0018)."""
        offered = use.offered
        if not offered:
            return None
        return OutputConstraint(
            calls=tuple(TaggedSchema(self.begin(t.name), t.parameters, self.end) for t in offered),
            triggers=(self._trigger,),
            require_call=use.must_call,
            max_calls=len(offered) if use.parallel else 1,
        )

    def parse_calls(self, text: str) -> list[ParsedCall] | None:
        calls: list[ParsedCall] = []
        position = 0
        while True:
            position = _skip_space(text, position)
            if position == len(text):
                return calls or None
            call = self._one_call(text, position)
            if call is None:
                return None
            calls.append(call[0])
            position = call[1]

    def _one_call(self, text: str, position: int) -> tuple[ParsedCall, int] | None:
        opening = self.open_tag.strip()
        if not text.startswith(opening, position):
            return None
        position = _skip_space(text, position + len(opening))
        head = self._head.match(text, position)
        if head is None:
            return None
        try:
            name = json.loads(head.group(1))
            arguments, end = _DECODER.raw_decode(text, head.end())
        except ValueError:
            return None
        if not isinstance(arguments, dict):
            return None
        closing = _CLOSE_OBJECT.match(text, end)
        if closing is None:
            return None
        after = _skip_space(text, closing.end())
        tag = self.close_tag.strip()
        if not text.startswith(tag, after):
            return None
        return ParsedCall(name, text[head.end() : end], head.end(), end), after + len(tag)


def _skip_space(text: str, position: int) -> int:
    match = _SPACE.match(text, position)
    return match.end() if match else position
