"""A response as the Responses API streams it: ``response.created``, ``.in_progress``, the
output items with their text deltas and call arguments, then ``response.completed`` (or
``.incomplete`` / ``.failed``), each event numbered by ``sequence_number``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from semantic.adapters.http.common import sse_data
from semantic.adapters.http.errors import problem_for
from semantic.adapters.http.openai_logprobs import TokenPieces, token_entries
from semantic.adapters.http.responses_items import call_item, message_item
from semantic.application.agents.responses import ResponseEvent
from semantic.application.agents.values import CommittedReply
from semantic.application.chat.generation import TextDelta
from semantic.application.chat.tool_replies import ArgumentsDelta, CallOpened
from semantic.domain.errors import SemanticError


class ResponseEvents:
    def __init__(
        self, started: dict[str, Any], message_id: str, pieces: TokenPieces | None = None
    ) -> None:
        """``pieces``: each token as its entries show it, where the request asked for
        log-probabilities."""
        self._started = started
        self._message_id = message_id
        self._pieces = pieces
        self._sequence = 0
        self._text: list[str] | None = None
        self._calls: list[dict[str, Any]] = []
        """The call items opened as their calls formed, their arguments so far."""
        self._closed: set[int] = set()
        """The output items closed as the next began (an item is done before the next)."""

    def event(self, kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return sse_data(body, kind)

    async def stream(
        self,
        first: ResponseEvent,
        rest: AsyncIterator[ResponseEvent],
        final: Callable[[], dict[str, Any]],
    ) -> AsyncIterator[str]:
        """``final`` gives the stored response once the reply is committed."""
        yield self.event("response.created", response=self._started)
        yield self.event("response.in_progress", response=self._started)
        try:
            event: ResponseEvent | None = first
            while event is not None:
                if isinstance(event, TextDelta) and (event.text or event.logprobs):
                    for line in self._delta(event):
                        yield line
                elif isinstance(event, CallOpened):
                    for line in self._open_call(event):
                        yield line
                elif isinstance(event, ArgumentsDelta):
                    yield self._arguments(event)
                elif isinstance(event, CommittedReply):
                    for line in self._end(final()):
                        yield line
                event = await anext(rest, None)
        except SemanticError as error:
            problem = problem_for(error)
            failed = {
                **self._started,
                "status": "failed",
                "error": {"code": problem.kind, "message": problem.message},
            }
            yield self.event("response.failed", response=failed)

    def _delta(self, delta: TextDelta) -> list[str]:
        lines = []
        if self._text is None:
            self._text = []
            lines += self._open_message()
        self._text.append(delta.text)
        pieces = self._pieces
        shown = [] if pieces is None else token_entries(delta.logprobs, pieces)
        lines.append(
            self.event(
                "response.output_text.delta",
                item_id=self._message_id,
                output_index=0,
                content_index=0,
                delta=delta.text,
                logprobs=shown,
            )
        )
        return lines

    def _open_message(self) -> list[str]:
        item = {
            "id": self._message_id,
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            self.event("response.output_item.added", output_index=0, item=item),
            self.event(
                "response.content_part.added",
                item_id=self._message_id,
                output_index=0,
                content_index=0,
                part=part,
            ),
        ]

    def _end(self, body: dict[str, Any]) -> list[str]:
        lines = []
        for index, item in enumerate(body["output"]):
            if index in self._closed:
                continue
            if item["type"] == "message":
                lines += self._close_message(index, item)
            else:
                lines += self._call(index, item)
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        lines.append(self.event(kind, response=body))
        return lines

    def _close_message(self, index: int, item: dict[str, Any]) -> list[str]:
        lines = self._open_message() if self._text is None else []
        part = item["content"][0]
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return [
            *lines,
            self.event(
                "response.output_text.done", **where, text=part["text"], logprobs=part["logprobs"]
            ),
            self.event("response.content_part.done", **where, part=part),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def _call_index(self, call: int) -> int:
        """A call's place among the output items: after the message, where there is one."""
        return call + (0 if self._text is None else 1)

    def _open_call(self, event: CallOpened) -> list[str]:
        """The call's item added, once the items before it are done: the message (its
        text is whole when a call begins) and the call before."""
        lines = []
        if self._text is not None and 0 not in self._closed:
            lines += self._close_message(0, message_item(self._message_id, "".join(self._text)))
            self._closed.add(0)
        if self._calls:
            before = self._call_index(len(self._calls) - 1)
            lines += self._call(before, self._calls[-1])
            self._closed.add(before)
        self._calls.append(call_item(event.id, event.name, "", complete=True))
        opened = {**self._calls[-1], "status": "in_progress"}
        index = self._call_index(event.index)
        lines.append(self.event("response.output_item.added", output_index=index, item=opened))
        return lines

    def _arguments(self, event: ArgumentsDelta) -> str:
        call = self._calls[event.index]
        call["arguments"] += event.text
        where = {"item_id": call["id"], "output_index": self._call_index(event.index)}
        return self.event("response.function_call_arguments.delta", **where, delta=event.text)

    def _call(self, index: int, item: dict[str, Any]) -> list[str]:
        """A call's closing events: it opened and its arguments came as it formed."""
        where = {"item_id": item["id"], "output_index": index}
        return [
            self.event(
                "response.function_call_arguments.done", **where, arguments=item["arguments"]
            ),
            self.event("response.output_item.done", output_index=index, item=item),
        ]
