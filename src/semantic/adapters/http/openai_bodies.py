"""OpenAI's response bodies and stream chunks for one request's choices: ``n`` replies to
the same prompt, each under its own ``index``, streamed as their tokens come."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any

from semantic.adapters.http.common import sse_data
from semantic.adapters.http.errors import body_for, problem_for
from semantic.adapters.http.openai_logprobs import TokenPieces, chat_content, completion_lists
from semantic.adapters.http.openai_tools import TOOL_CALLS, CallShape
from semantic.adapters.http.translate import OPENAI_FINISH
from semantic.application.chat.chat_reply import ChatOutcome, ChatReply
from semantic.application.chat.generation import GenerationResult, TextDelta
from semantic.application.chat.tool_replies import Reply
from semantic.domain.errors import SemanticError
from semantic.domain.generation import TokenLogprob

DONE = "data: [DONE]\n\n"

ChoiceChunks = Callable[[int, ChatReply, dict[int, GenerationResult]], AsyncIterator[str]]
"""One choice's chunks under its index, its result kept in the dict once it ends."""


class ReplyBodies:
    """Response bodies of one request, in OpenAI's shapes; ``pieces``: each token as a
    log-probability's entry shows it, where the request asked for them (None: it did not)."""

    def __init__(
        self,
        prefix: str,
        kind: str,
        model: str,
        pieces: TokenPieces | None = None,
        calls: CallShape = TOOL_CALLS,
    ) -> None:
        self.id = f"{prefix}-{uuid.uuid4().hex[:24]}"
        self.kind = kind
        self.model = model
        self.created = int(time.time())
        self.pieces = pieces
        self.calls = calls
        """How a reply's calls are written (``tool_calls``, or the older ``function_call``)."""
        self._null_usage = False

    def chat(self, outcomes: Sequence[ChatOutcome]) -> dict[str, Any]:
        choices = [self._chat_choice(index, o) for index, o in enumerate(outcomes)]
        return self._body(choices, [o.result for o in outcomes])

    def _chat_choice(self, index: int, outcome: ChatOutcome) -> dict[str, Any]:
        result, answer = outcome.result, outcome.answer
        message: dict[str, Any] = {"role": "assistant", "content": answer.content}
        if answer.calls:
            message["content"] = answer.content or None
            message |= self.calls.message(answer.calls)
        return {
            "index": index,
            "message": message,
            "finish_reason": self._finish(result, answer),
            "logprobs": self._chat_logprobs(None if answer.calls else result.logprobs),
        }

    def text(self, results: Sequence[GenerationResult]) -> dict[str, Any]:
        choices = [
            {
                "index": index,
                "text": result.text,
                "logprobs": self._completion_logprobs(result.logprobs),
                "finish_reason": OPENAI_FINISH[result.finish_reason],
            }
            for index, result in enumerate(results)
        ]
        return self._body(choices, results)

    def chat_chunks(self, replies: Sequence[ChatReply], usage: bool) -> AsyncIterator[str]:
        """Each choice's text and calls as they form, each call as OpenAI streams one: id,
        type and name in its first delta, then its arguments in pieces."""
        return self._all(replies, self._chat_choice_chunks, usage, "/v1/chat/completions")

    async def _chat_choice_chunks(
        self, index: int, reply: ChatReply, ended: dict[int, GenerationResult]
    ) -> AsyncIterator[str]:
        def chunk(delta: dict[str, Any] | None, finish: str | None, logprobs: Any = None) -> str:
            body = {"index": index, "delta": delta or {}, "finish_reason": finish}
            return self._chunk([{**body, "logprobs": logprobs}])

        yield chunk({"role": "assistant", "content": None if reply.must_call else ""}, None)
        async for event in reply.events():
            if not isinstance(event, ChatOutcome):
                shown = event.logprobs if isinstance(event, TextDelta) else ()
                # (text re-read for calls carries none: null, as a call's pieces)
                yield chunk(self.calls.delta(event), None, self._chat_logprobs(shown or None))
                continue
            ended[index] = event.result
            yield chunk(None, self._finish(event.result, event.answer))

    def text_chunks(self, replies: Sequence[ChatReply], usage: bool) -> AsyncIterator[str]:
        return self._all(replies, self._text_choice_chunks, usage, "/v1/completions")

    async def _text_choice_chunks(
        self, index: int, reply: ChatReply, ended: dict[int, GenerationResult]
    ) -> AsyncIterator[str]:
        offset = 0

        def chunk(text: str, finish: str | None, logprobs: Any = None) -> str:
            body = {"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs}
            return self._chunk([body])

        async for event in reply.events():
            if isinstance(event, TextDelta):
                lists = self._completion_logprobs(event.logprobs, offset)
                offset += len(event.text)
                yield chunk(event.text, None, lists)
            elif isinstance(event, ChatOutcome):
                ended[index] = event.result
                yield chunk("", OPENAI_FINISH[event.result.finish_reason])

    async def _all(
        self, replies: Sequence[ChatReply], choice: ChoiceChunks, usage: bool, path: str
    ) -> AsyncIterator[str]:
        """The choices' chunks as they come, then the usage of all (where asked: every
        chunk before it then says ``"usage": null``, as OpenAI's do) and the end; an error
        is sent as the event the same error outside a stream would be."""
        self._null_usage = usage
        ended: dict[int, GenerationResult] = {}  # each choice's result, by index
        streams = [choice(index, reply, ended) for index, reply in enumerate(replies)]
        try:
            async with contextlib.aclosing(merged(streams)) as lines:
                async for line in lines:
                    yield line
            if usage:
                yield self._chunk([], _usage([ended[i] for i in sorted(ended)]))
        except SemanticError as error:  # typed as the same error outside a stream would be
            yield sse_data(body_for(path, problem_for(error)))
        yield DONE

    def _finish(self, result: GenerationResult, answer: Reply) -> str:
        """``tool_calls`` for whole calls; a reply cut inside one ends as it was cut."""
        whole = answer.calls and not answer.cut_in_a_call
        return self.calls.finish if whole else OPENAI_FINISH[result.finish_reason]

    def _chat_logprobs(self, entries: Sequence[TokenLogprob] | None) -> dict[str, Any] | None:
        """Chat's ``logprobs`` for ``entries``, where the request asked (else None)."""
        if self.pieces is None or entries is None:
            return None
        return chat_content(entries, self.pieces)

    def _completion_logprobs(
        self, entries: Sequence[TokenLogprob], offset: int = 0
    ) -> dict[str, Any] | None:
        """The completions' ``logprobs`` for ``entries``, where the request asked (else None)."""
        return None if self.pieces is None else completion_lists(entries, self.pieces, offset)

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> str:
        body: dict[str, Any] = {
            "id": self.id,
            "object": f"{self.kind}.chunk" if self.kind == "chat.completion" else self.kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None or self._null_usage:
            body["usage"] = usage
        return sse_data(body)

    def _body(
        self, choices: list[dict[str, Any]], results: Sequence[GenerationResult]
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": self.kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": _usage(results),
        }


async def merged(streams: Sequence[AsyncIterator[str]]) -> AsyncGenerator[str, None]:
    """The streams' items in the order they come; one stream's error ends them all."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield item
        return
    queue: asyncio.Queue[str | Exception | None] = asyncio.Queue()

    async def pump(stream: AsyncIterator[str]) -> None:
        """Ends with exactly one item however it ends: None, or the error that ended it."""
        try:
            async for item in stream:
                queue.put_nowait(item)
        except Exception as error:  # noqa: BLE001 - handed to the reader, which raises it
            queue.put_nowait(error)
        except BaseException:  # cancelled from outside: the reader must not wait for it
            queue.put_nowait(SemanticError("a choice's stream ended early"))
            raise
        else:
            queue.put_nowait(None)

    pumps = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        for _ in pumps:  # each pump ends with one None
            while (came := await queue.get()) is not None:
                if isinstance(came, Exception):
                    raise came
                yield came
    finally:
        for task in pumps:
            task.cancel()


def _usage(results: Sequence[GenerationResult]) -> dict[str, Any]:
    """The prompt once (every choice shares it), the choices' tokens together."""
    prompt = results[0].usage if results else None
    completion = sum(r.usage.completion_tokens for r in results)
    prompt_tokens = prompt.prompt_tokens if prompt else 0
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": prompt.cached_tokens if prompt else 0},
    }
