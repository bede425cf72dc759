"""One chat turn for every plain front door (OpenAI's chat completions and completions,
Anthropic's messages): a request value in, its reply as pieces out.

Done here once, for each of them: the prompt rendered (calls this server generated shown
as they were written, ``CallMemory``; a context edit applied), what the reply may be
(``reply_shape``), the refusals named by the request's own fields, the agent's retention
hints kept once the request has started, the reply's calls read as they stream and kept
for their round trip, and the wait for the whole reply. The routes map their wire format
to a ``ChatAsk`` and the pieces back. Agents and Responses run theirs through
``AgentService``, whose prompt is its transcript (``agents.turns``); their reply is shaped
by the same ``reply_shape``, started and read by the same ``start_reply`` and
``ChatReply``, on the same engine call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from semantic.application.chat.call_memory import CallMemory
from semantic.application.chat.chat_reply import ChatReply, start_reply
from semantic.application.chat.context_edits import AppliedEdit, edited
from semantic.application.chat.generation import (
    GenerationHandle,
    GenerationInput,
    Limits,
)
from semantic.application.chat.message_threads import MessageThreads
from semantic.application.chat.reply_shape import FREE, no_room_for_tools, reply_shape
from semantic.application.chat.transcript import new_call_id
from semantic.domain.chat import ChatMessage
from semantic.domain.context_edits import ClearToolUses
from semantic.domain.errors import InvalidRequestError, PromptTooLongError
from semantic.domain.generation import GREEDY, Priority, SamplingParams, TokenPiece
from semantic.domain.retention import Retention
from semantic.domain.tools import ToolUse
from semantic.ports.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class ChatAsk:
    """A plain request as every front door says it. Either ``messages`` (a chat) or
    ``prompt`` (a completion's text or token ids, its errors named ``prompt``)."""

    namespace: str
    agent_id: str | None = None
    messages: tuple[ChatMessage, ...] = ()
    prompt: str | tuple[int, ...] | None = None
    tools: ToolUse | None = None
    json_schema: str | None = None
    """The schema a reply that calls no tool must match (JSON text)."""
    continue_final: bool = False
    """The final assistant message is a prefill the reply continues (Anthropic's): the
    reply is then free, its calls not read."""
    context_edit: ClearToolUses | None = None
    max_tokens: int | None = None
    default_max_tokens: int | None = None
    """The front door's own default, within the room the prompt leaves (None: the server's)."""
    max_tokens_lowered: bool = False
    """``max_tokens`` is a ceiling the server lowers to what it gives (its cap, the room
    the prompt leaves) rather than refuses: Anthropic's rule since its 4.5 models, whose
    clients send their model's largest output (pydantic-ai 16,384 for a model it does not
    know) and learn where the window ended from the stop reason."""
    sampling: SamplingParams = GREEDY
    stop: tuple[str, ...] = ()
    priority: Priority = Priority.NORMAL
    retention: Mapping[str, Any] = field(default_factory=dict)
    """Retention hints for the agent, checked already; kept once the request has started."""
    new_call_id: Callable[[], str] = new_call_id
    """Ids for the reply's calls, in the front door's own style."""
    logprobs: int | None = None
    """Each token's log-probability with that many alternatives; None: none."""


class PlainAgents(Protocol):
    """What the chat turn asks of the agents use case: a plain request started (one naming
    an agent is tracked and leased as a turn is), and an agent's retention hints kept."""

    async def start_plain(self, request: GenerationInput) -> GenerationHandle: ...

    async def retain(
        self, namespace: str, agent_id: str, change: Mapping[str, Any], *, known: bool = False
    ) -> Retention: ...


@dataclass(frozen=True, slots=True)
class Rendered:
    """A chat's prompt as the model reads it, and the context edit applied to it."""

    chat: list[ChatMessage]
    prompt: list[int]
    applied: AppliedEdit | None = None


class ChatTurns:
    """The plain front doors' one use case: ``start`` a reply, or ``render`` its prompt (a
    count of tokens asks only that)."""

    def __init__(
        self,
        agents: PlainAgents,
        tokenizer: Tokenizer,
        calls: CallMemory,
        limits: Limits,
        threads: MessageThreads,
    ) -> None:
        self.threads = threads
        """The conversations a Messages thread holds, each made whole before its turn."""
        self._agents = agents
        self._tokenizer = tokenizer
        self._calls = calls
        self._limits = limits

    async def start(self, ask: ChatAsk) -> ChatReply:
        """The reply started: refusals (bad input, a full queue, a schema the grammar
        cannot take) are raised here, before a front door commits to a stream."""
        try:
            return await self._start(ask)
        except InvalidRequestError as error:
            if ask.prompt is not None and error.param == "messages":
                error.param = "prompt"  # a completion's own field
            raise

    async def _start(self, ask: ChatAsk) -> ChatReply:
        shape = (
            FREE
            if ask.continue_final
            else reply_shape(self._tokenizer.tool_format, ask.tools, ask.json_schema)
        )
        rendered = await self.render(ask)
        generation = GenerationInput(
            tuple(rendered.prompt),
            ask.namespace,
            ask.agent_id,
            self._max_tokens(ask, len(rendered.prompt)),
            ask.sampling,
            ask.stop,
            ask.priority,
            shape.constraint,
            ask.logprobs,
        )
        keep = functools.partial(self._calls.remember, ask.namespace)  # calls as generated
        start = self._agents.start_plain(generation)
        try:
            reply = await start_reply(
                start, shape, ask.tools, ask.new_call_id, keep=keep, applied=rendered.applied
            )
        except PromptTooLongError as error:
            raise self._too_long(ask, rendered, error) from None
        try:
            if ask.retention and ask.agent_id is not None:
                await self._agents.retain(ask.namespace, ask.agent_id, ask.retention)
        except BaseException:  # a request whose hints cannot be kept does not run
            reply.close()
            raise
        return reply

    def token_piece(self, token: int) -> TokenPiece:
        """One token as a log-probability's entry shows it."""
        return TokenPiece(self._tokenizer.decode([token]), self._tokenizer.token_bytes(token))

    async def render(self, ask: ChatAsk) -> Rendered:
        """The prompt the request runs on (and what its context edit cleared)."""
        if ask.prompt is not None:
            return Rendered([], self._prompt_ids(ask.prompt))
        chat = list(ask.messages)
        if ask.context_edit is None:
            return await self._rendered(ask, chat)

        async def measure(messages: Sequence[ChatMessage]) -> int:
            return len((await self._rendered(ask, messages)).prompt)

        chat, applied = await edited(chat, ask.context_edit, measure, self._count)
        whole = await self._rendered(ask, chat)
        return Rendered(whole.chat, whole.prompt, applied)

    async def _rendered(self, ask: ChatAsk, messages: Sequence[ChatMessage]) -> Rendered:
        restored = await self._calls.restore(ask.namespace, messages)
        prompt = self._tokenizer.render_chat(
            restored,
            scope=ask.namespace,
            continue_final=ask.continue_final,
            tools=ask.tools.tools if ask.tools else (),
        )
        return Rendered(restored, prompt)

    def _count(self, text: str) -> int:
        return len(self._tokenizer.encode(text)) if text else 0

    def _prompt_ids(self, prompt: str | tuple[int, ...]) -> list[int]:
        """A completion's ids: its text encoded, or the ids it gave (checked, as every
        prompt is, by the engine's intake: ``request_validation``)."""
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("prompt must not be empty", param="prompt")
            return self._tokenizer.encode(prompt)
        return list(prompt)

    @property
    def max_context(self) -> int:
        """The tokens a prompt and its reply share (a reply that fills them ended there)."""
        return self._limits.max_context

    def _max_tokens(self, ask: ChatAsk, prompt_tokens: int) -> int | None:
        room = max(1, self._limits.max_context - prompt_tokens)  # a prompt over it is refused
        if ask.max_tokens is not None and ask.max_tokens_lowered:
            return min(ask.max_tokens, self._limits.max_tokens_cap, room)
        if ask.max_tokens is not None or ask.default_max_tokens is None:
            return ask.max_tokens
        return min(ask.default_max_tokens, room)

    def _too_long(
        self, ask: ChatAsk, rendered: Rendered, error: PromptTooLongError
    ) -> PromptTooLongError:
        """A prompt that fits without its tools but not with them names ``tools``."""
        if ask.tools is None or error.param != "messages":
            return error
        bare = self._tokenizer.render_chat(rendered.chat, scope=ask.namespace)
        if len(bare) >= self._limits.max_context:
            return error
        return no_room_for_tools(error, ask.tools)
