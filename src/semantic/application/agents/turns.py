"""One turn of an agent: its conversation rendered with the new message, the reply
generated, and both committed before the result is reported.

The service (``AgentService.send``) holds the agent's lock and lease around this; a turn
a delete ends keeps nothing. The reply is started and read as every front door's is
(``chat_reply.start_reply``): its tool calls are read as it streams, and only the text
before them is passed on as it comes.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence

from semantic.application.agents.live_turns import LiveTurn
from semantic.application.agents.values import CommittedReply, Turn, TurnStarted
from semantic.application.cache.store import AgentCacheStore
from semantic.application.chat.chat_reply import ChatOutcome, ChatReply, start_reply
from semantic.application.chat.context_edits import policy_applied
from semantic.application.chat.generation import (
    CheckedInput,
    GenerationInput,
    GenerationResult,
    GenerationService,
)
from semantic.application.chat.prompt_marks import mark
from semantic.application.chat.reply_shape import ReplyShape, reply_shape
from semantic.application.chat.tool_replies import Reply, TurnEvent
from semantic.application.chat.transcript import (
    answered,
    answers_history,
    asked,
    chat_message,
    check_answers,
    new_call_id,
    outgrown,
    record_calls,
    whole,
)
from semantic.domain.chat import ChatMessage
from semantic.domain.context_edits import ContextPolicy, turn_starts, without_oldest_turns
from semantic.domain.errors import AgentDeletedError, PromptTooLongError
from semantic.ports.metadata_store import AgentRecord, MessageRecord, Transcripts
from semantic.ports.tokenizer import Tokenizer

TRUNCATED_SHARE = 0.5
"""How much of the room a truncated conversation fills: the rest is for the turns that
follow it, each starting from the KV of the one before."""

Write = Callable[[Sequence[MessageRecord]], Awaitable[None]]
"""Commits a turn's question and reply (appended to the transcript, or with the agent)."""


class TurnRunner:
    """Builds a turn's request and runs it to its committed reply."""

    def __init__(
        self,
        generation: GenerationService,
        transcripts: Transcripts,
        cache: AgentCacheStore,
        tokenizer: Tokenizer,
    ) -> None:
        self._generation = generation
        self._transcripts = transcripts
        self._cache = cache
        self._tokenizer = tokenizer

    async def request(self, record: AgentRecord, turn: Turn) -> tuple[CheckedInput, int]:
        """The whole conversation with the new message, checked against the context; and
        how many messages the transcript holds before it."""
        history = await self._transcripts.messages(record.namespace, record.agent_id)
        return self.request_of(record, history, turn), len(history)

    def request_of(
        self,
        record: AgentRecord,
        history: Sequence[MessageRecord],
        turn: Turn,
        known: Sequence[int] = (),
    ) -> CheckedInput:
        """``history`` with the new message, rendered and checked against the context;
        ``known``: an earlier prompt's ids it likely repeats (``Tokenizer.render_chat``)."""
        check_answers(history, turn)
        request = GenerationInput(
            tuple(self._prompt(record, history, turn, known)),
            record.namespace,
            record.agent_id,
            turn.max_tokens,
            turn.sampling,
            turn.stop,
            turn.priority,
            self._shape(turn).constraint,
            turn.logprobs,
        )
        try:
            return self._generation.check(request)
        except PromptTooLongError as error:
            raise outgrown(error, record.agent_id) from None

    def prompt_tokens(
        self, record: AgentRecord, history: Sequence[MessageRecord], turn: Turn
    ) -> int:
        """The length of ``request_of``'s prompt, whether or not it fits the context."""
        check_answers(history, turn)
        return len(self._prompt(record, history, turn, ()))

    def fitted_history(
        self, record: AgentRecord, history: Sequence[MessageRecord], turn: Turn
    ) -> list[MessageRecord] | None:
        """``history`` less its fewest oldest turns that leave the prompt within half the
        room the reply leaves (``TRUNCATED_SHARE``): the turns after it then grow from the
        cached KV of this one instead of each dropping a turn and starting over (ADR 0020).
        All of it when nothing less fits, but the turn whose calls the new input answers;
        None when that leaves nothing to drop."""
        room = self._generation.limits.max_context - (turn.max_tokens or 0)
        target = int(room * TRUNCATED_SHARE)
        turns = len(turn_starts(history)) - (1 if answers_history(turn) else 0)
        if turns < 1:
            return None
        low, high = 1, turns
        while low < high:  # the fewest turns dropped that fit: fitting only grows with more
            middle = (low + high) // 2
            kept = without_oldest_turns(history, middle)
            if len(self._prompt(record, kept, turn, ())) <= target:
                high = middle
            else:
                low = middle + 1
        return without_oldest_turns(history, low)

    def _prompt(
        self,
        record: AgentRecord,
        history: Sequence[MessageRecord],
        turn: Turn,
        known: Sequence[int],
    ) -> list[int]:
        messages = [*history, *asked(turn, 0.0)]
        system = [ChatMessage("system", record.system_prompt)] if record.system_prompt else []
        chat = system + [chat_message(m) for m in messages]
        tools = turn.tools.tools if turn.tools else ()

        def render(shown: Sequence[ChatMessage], ids: Sequence[int] = ()) -> list[int]:
            return self._tokenizer.render_chat(
                shown, scope=record.namespace, tools=tools, known=ids
            )

        prompt = render(chat, known)
        if record.context_policy is None:
            return prompt
        policy = ContextPolicy.from_json(record.context_policy)
        if len(prompt) < policy.trigger_tokens:  # nor was any request before it: no edit
            return prompt
        view = system + [_with_calls(m) for m in messages]
        edited = policy_applied(chat, view, policy, lambda c: len(render(c)), self._count)
        return prompt if edited == chat else render(edited, known)

    def _shape(self, turn: Turn) -> ReplyShape:
        """The plain front doors' rule (``reply_shape``): calls, or an answer of the schema."""
        schema = turn.constraint.json_schema if turn.constraint is not None else None
        return reply_shape(self._tokenizer.tool_format, turn.tools, schema)

    def _count(self, text: str) -> int:
        return len(self._tokenizer.encode(text)) if text else 0

    async def run(
        self,
        request: CheckedInput,
        live: LiveTurn,
        turn: Turn,
        earlier: int,
        write: Write,
    ) -> AsyncGenerator[TurnEvent | TurnStarted, None]:
        """The turn's events: ``TurnStarted`` once its request is queued, then its text and
        result. Its reply is committed with its question (after ``earlier`` messages;
        ``write`` commits them) before the result is reported, unless a delete ended the
        turn."""
        start = self._generation.start(request)  # kept with the transcript, not by the reply
        reply = await start_reply(start, self._shape(turn), turn.tools, new_call_id)
        live.request_id = reply.request_id
        try:
            yield TurnStarted(reply.request_id)
            relay = self._relay(reply, request.request, live, turn, earlier=earlier, write=write)
            async with contextlib.aclosing(relay) as events:
                async for event in events:
                    yield event
        finally:  # also where the reader left before the first token
            reply.close()

    async def _relay(
        self,
        reply: ChatReply,
        request: GenerationInput,
        live: LiveTurn,
        turn: Turn,
        *,
        earlier: int,
        write: Write,
    ) -> AsyncGenerator[TurnEvent, None]:
        asked_at = time.time()
        async with contextlib.aclosing(reply.events()) as events:  # cut short by a delete
            async for event in events:
                if live.deleted:
                    raise AgentDeletedError(live.agent_id, live.namespace)
                if not isinstance(event, ChatOutcome):
                    yield event
                    continue
                place = await self._commit(live, turn, asked_at, event.answer, write)
                rendered = mark(self._cache.fingerprint, request.prompt_tokens)
                yield _committed(event.result, event.answer, earlier + place, rendered)

    async def _commit(
        self, live: LiveTurn, turn: Turn, asked_at: float, answer: Reply, write: Write
    ) -> int:
        """The turn's question and reply committed (room made on a full disk), to the end
        even if the caller goes away; how many messages that was."""
        records = [*asked(turn, asked_at), answered(answer)]
        keep = functools.partial(write, records)
        await whole(self._cache.keeping(live.namespace, live.agent_id, keep))
        return len(records)


def _with_calls(record: MessageRecord) -> ChatMessage:
    """A transcript message with its calls shown, a reply kept as generated included."""
    if record.raw is None:
        return chat_message(record)
    return ChatMessage("assistant", record.raw, tool_calls=record_calls(record))


def _committed(event: GenerationResult, answer: Reply, place: int, rendered: str) -> CommittedReply:
    """The result as reported once committed: the reply is message ``place``."""
    return CommittedReply(
        event.request_id,
        answer.content,
        event.finish_reason,
        event.usage,
        event.stats,
        event.stop_string,
        event.logprobs,
        place=place,
        calls=answer.calls,
        rendered=rendered,
        cut_in_a_call=answer.cut_in_a_call,
    )
