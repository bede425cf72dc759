"""Stateful agents: the server keeps each agent's transcript and KV; clients send only the
new message. A reply is acknowledged only after it is committed with its question."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from semantic.application.cache.lineage import branch_prefix
from semantic.application.cache.store import AgentCacheStore
from semantic.application.generation import (
    GenerationEvent,
    GenerationHandle,
    GenerationInput,
    GenerationResult,
    GenerationService,
    TextDelta,
)
from semantic.application.keyed_locks import KeyedLocks
from semantic.application.leases import AgentLeases
from semantic.application.tool_replies import Call, Reply, ReplyReader
from semantic.domain.chat import ChatMessage
from semantic.domain.constraints import OutputConstraint
from semantic.domain.errors import (
    AgentDeletedError,
    AgentKeepsTranscriptError,
    AgentNotFoundError,
    InvalidRequestError,
    PromptTooLongError,
)
from semantic.domain.generation import GREEDY, Priority, SamplingParams
from semantic.domain.tools import ToolCall, ToolUse
from semantic.ports.leases import Lease
from semantic.ports.metadata_store import AgentRecord, MessageRecord, MetadataStore
from semantic.ports.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class CacheState:
    tokens: int
    blocks: int
    hot_blocks: int
    disk_blocks: int
    bytes_on_disk: int


@dataclass(frozen=True, slots=True)
class AgentInfo:
    namespace: str
    agent_id: str
    system_prompt: str | None
    created_at: float
    last_used: float
    messages: int
    cache: CacheState


@dataclass(frozen=True, slots=True)
class CommittedReply(GenerationResult):
    """A turn's result once its messages are committed: the reply is message ``place`` of
    the transcript (``msg_<place>``), so a client can page on from it."""

    place: int = 0
    calls: tuple[Call, ...] = ()
    """The reply's tool calls (``text`` is then the text before them)."""


@dataclass(slots=True, eq=False)
class _LiveTurn:
    """A turn, or a plain request naming the agent, between its arrival and its end, so a
    delete can end it."""

    namespace: str
    agent_id: str
    request_id: str | None = None
    deleted: bool = False
    ended: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def check(self) -> None:
        if self.deleted:
            raise AgentDeletedError(self.agent_id, self.namespace)


INTERNAL_PREFIX = "~"
"""Agents the server makes for itself (a response's, a conversation's): never a client's
agent id, never listed."""

END_WAIT_S = 5.0
"""How long a delete waits for the turns it ended to finish (a stream whose client reads
nothing may take longer; it keeps nothing anyway)."""


@dataclass(frozen=True, slots=True)
class Turn:
    content: str
    max_tokens: int | None = None
    sampling: SamplingParams = GREEDY
    stop: tuple[str, ...] = ()
    priority: Priority = Priority.NORMAL
    tool_call_id: str | None = None
    """A tool's result: the call of the agent's last reply it answers."""
    tools: ToolUse | None = None
    """The tools this turn's reply may call."""
    items: tuple[MessageRecord, ...] = ()
    """Messages asked at once in place of ``content`` (the Responses API's input items:
    messages, calls sent back and their results)."""
    constraint: OutputConstraint | None = None
    """What a reply that calls no tool must match (a JSON Schema)."""

    @property
    def role(self) -> str:
        return "user" if self.tool_call_id is None else "tool"


class AgentService:
    def __init__(
        self,
        generation: GenerationService,
        metadata: MetadataStore,
        cache: AgentCacheStore,
        tokenizer: Tokenizer,
        leases: AgentLeases | None = None,
    ) -> None:
        """``leases``: instances share the database, and an agent's turns take its lease
        (None: this instance is the database's only one, its own locks are enough)."""
        self._generation = generation
        self._metadata = metadata
        self._cache = cache
        self._tokenizer = tokenizer
        self._leases = leases
        self._locks = KeyedLocks()
        self._live: dict[tuple[str, str], set[_LiveTurn]] = {}
        self._deleting: set[tuple[str, str]] = set()
        """Agents a delete is ending: what arrives meanwhile is refused, not waited for."""
        self._letting_go: set[asyncio.Future[None]] = set()
        """Leases of plain requests being released (kept referenced till they are)."""

    async def create(self, namespace: str, agent_id: str, system_prompt: str | None) -> AgentInfo:
        if system_prompt:  # an agent no turn could ever fit is refused now, not at each turn
            try:
                chat = [ChatMessage("system", system_prompt)]
                prompt = tuple(self._tokenizer.render_chat(chat, scope=namespace))
                self._generation.check(GenerationInput(prompt, namespace, agent_id))
            except PromptTooLongError as error:
                raise PromptTooLongError(
                    f"the system prompt leaves no room for a conversation: {error}",
                    param="system_prompt",
                ) from None
        record = AgentRecord(
            namespace, agent_id, system_prompt=system_prompt, keeps_transcript=True
        )
        await self._cache.keeping(
            namespace, agent_id, functools.partial(self._metadata.create_agent, record)
        )
        return await self.get(namespace, agent_id)

    async def get(self, namespace: str, agent_id: str) -> AgentInfo:
        record = await self._record(namespace, agent_id)
        counts = await self._metadata.message_counts(namespace)
        return await self._info(record, counts.get(agent_id, 0))

    async def start_plain(self, request: GenerationInput) -> GenerationHandle:
        """Start a plain (OpenAI or Anthropic) request. One naming an agent is tracked like
        a turn, so deleting the agent ends it and it keeps nothing; with leases it holds the
        agent's lease till it ends, as a turn does (``AgentBusyError`` if another instance
        keeps it past the wait)."""
        if request.agent_id is None:
            return await self._generation.start(request)
        await self.check_plain_use(request.namespace, request.agent_id)
        live = _LiveTurn(request.namespace, request.agent_id)
        self._track(live)
        if live.deleted:
            self._untrack(live)
            raise AgentDeletedError(request.agent_id, request.namespace)
        lease = contextlib.AsyncExitStack()
        try:
            await lease.enter_async_context(self._leased(request.namespace, request.agent_id))
            handle = await self._generation.start(
                request, check=live.check, on_end=functools.partial(self._end_plain, live, lease)
            )
        except BaseException:
            await lease.aclose()
            self._untrack(live)
            raise
        live.request_id = handle.request_id
        return handle

    def _end_plain(self, live: _LiveTurn, lease: contextlib.AsyncExitStack) -> None:
        """A plain request naming an agent is over: its save was fenced by the lease it
        held (taken when it started, like a turn's), which goes now."""
        self._untrack(live)
        if self._leases is not None:
            letting_go = asyncio.ensure_future(lease.aclose())
            self._letting_go.add(letting_go)
            letting_go.add_done_callback(self._letting_go.discard)

    async def check_plain_use(self, namespace: str, agent_id: str) -> None:
        """A plain (OpenAI or Anthropic) request may name any agent but one whose transcript
        this server keeps, from its creation on: its reply's KV would take the place of the
        transcript's."""
        record = await self._metadata.agent(namespace, agent_id)
        if record is not None and record.keeps_transcript:
            raise AgentKeepsTranscriptError(agent_id)

    async def list_agents(
        self, namespace: str, after: str | None = None, limit: int | None = None
    ) -> tuple[list[AgentInfo], bool]:
        """The namespace's agents by id, those after ``after``, at most ``limit``; and
        whether more follow."""
        records = [
            r
            for r in await self._metadata.agents(namespace)
            if not r.anonymous
            and not r.agent_id.startswith(INTERNAL_PREFIX)
            and (after is None or r.agent_id > after)
        ]
        page = records if limit is None else records[:limit]
        counts = await self._metadata.message_counts(namespace)
        infos = [await self._info(r, counts.get(r.agent_id, 0)) for r in page]
        return infos, len(page) < len(records)

    async def internal_agents(self, prefix: str) -> list[tuple[str, str]]:
        """(namespace, agent id) of every agent, in any namespace, whose id starts with
        ``prefix`` (one of ``INTERNAL_PREFIX``'s), for their owner's sweep at start."""
        if not prefix.startswith(INTERNAL_PREFIX):
            raise ValueError(f"{prefix!r} names no internal agents")
        found = await self._metadata.agents()
        return [(r.namespace, r.agent_id) for r in found if r.agent_id.startswith(prefix)]

    async def delete(self, namespace: str, agent_id: str) -> None:
        """Ends the agent's queued and running turns and plain requests first (they keep
        nothing and say the agent was deleted), rather than waiting minutes for a long reply
        to finish, and waits for them, so one that finished first has committed what it
        saves before the agent is deleted. Of deletes that race, only the first finds the
        agent (the others are a 404); an agent whose first request was still running is
        found too."""
        key = (namespace, agent_id)
        if key in self._deleting:  # another delete is ending it: that one found it
            raise AgentNotFoundError(agent_id, namespace)
        self._deleting.add(key)
        try:
            await self._delete(namespace, agent_id)
        finally:
            self._deleting.discard(key)

    async def _delete(self, namespace: str, agent_id: str) -> None:
        live = list(self._live.get((namespace, agent_id), set()))
        for turn in live:
            turn.deleted = True
            if turn.request_id is not None:
                self._generation.cancel(turn.request_id)
        if live:
            waits = [asyncio.create_task(t.ended.wait()) for t in live]
            _, late = await asyncio.wait(waits, timeout=END_WAIT_S)
            for wait in late:
                wait.cancel()
        # Saves still queued (of one that finished first, or of a plain request whose
        # client left while its save waited) would bring the agent back after the delete.
        await self._cache.flush()
        async with self._lock(namespace, agent_id), self._leased(namespace, agent_id) as lease:
            record = await self._metadata.agent(namespace, agent_id)
            if record is None or record.anonymous:
                if live:  # its first requests were running: they are ended, nothing kept
                    return
                raise AgentNotFoundError(agent_id, namespace)
            delete = self._metadata.delete_agent
            orphans = await self._cache.keeping(
                namespace, agent_id, functools.partial(delete, namespace, agent_id, lease=lease)
            )
            for branch in await self._metadata.agents(namespace):
                if branch.agent_id.startswith(branch_prefix(agent_id)):
                    orphans += await self._metadata.delete_agent(namespace, branch.agent_id)
        await self._cache.forget(orphans)

    async def fork(self, namespace: str, source_id: str, new_id: str) -> AgentInfo:
        """A new agent sharing every block and message of the source: nothing is copied but
        ids, and the two diverge from their next turn on."""
        async with self._lock(namespace, source_id), self._leased(namespace, new_id):
            source = await self._record(namespace, source_id)
            await self._branch(namespace, source_id, new_id, source.system_prompt)
        return await self.get(namespace, new_id)

    async def branch(
        self, namespace: str, source_id: str, new_id: str, system_prompt: str | None
    ) -> AgentRecord:
        """A fork whose system prompt is ``system_prompt`` (a response's own instructions,
        which OpenAI does not carry along a chain), without the info ``fork`` reads back:
        a chain's next turn pays for one commit before it starts."""
        async with self._lock(namespace, source_id):
            return await self._branch(namespace, source_id, new_id, system_prompt)

    async def _branch(
        self, namespace: str, source_id: str, new_id: str, system_prompt: str | None
    ) -> AgentRecord:
        """One transaction (the block list, the reference counts, a copy of the message
        rows), so a crash leaves no half-made fork."""
        write = functools.partial(
            self._metadata.fork_agent, namespace, source_id, new_id, system_prompt
        )
        record = await self._cache.keeping(namespace, new_id, write)
        if record is None:
            raise AgentNotFoundError(source_id, namespace)
        return record

    async def messages(self, namespace: str, agent_id: str) -> list[MessageRecord]:
        await self._record(namespace, agent_id)
        return await self._metadata.messages(namespace, agent_id)

    async def send(
        self, namespace: str, agent_id: str, turn: Turn
    ) -> AsyncGenerator[GenerationEvent, None]:
        """Append the user's message, generate the reply, commit both, then report the
        result. Turns of one agent run one at a time. On a full disk, cached KV makes room
        for the transcript; a turn that cannot be kept is refused (``DiskFullError``),
        never answered."""
        if not turn.content and turn.tool_call_id is None and not turn.items:
            raise InvalidRequestError("the message is empty", param="content")
        live = _LiveTurn(namespace, agent_id)
        with self._tracked(live):
            async with self._lock(namespace, agent_id):
                if live.deleted:
                    raise AgentDeletedError(agent_id, namespace)
                self._cache.check_room()
                async with self._leased(namespace, agent_id) as lease:
                    request, earlier = await self._request(namespace, agent_id, turn)
                    async for event in self._run(request, live, turn, earlier, lease):
                        yield event

    @contextlib.asynccontextmanager
    async def _leased(self, namespace: str, agent_id: str) -> AsyncIterator[Lease | None]:
        """The agent's lease (waiting a little for another instance to let it go; else
        ``AgentBusyError``), or None without leases. Taken before the transcript is read,
        so the turn reads what the last holder committed."""
        if self._leases is None:
            yield None
            return
        async with self._leases.holding(namespace, agent_id) as lease:
            yield lease

    async def _run(
        self,
        request: GenerationInput,
        live: _LiveTurn,
        turn: Turn,
        earlier: int,
        lease: Lease | None,
    ) -> AsyncIterator[GenerationEvent]:
        """The turn's events. Its reply is committed with its question (after ``earlier``
        messages) before the result is reported, unless a delete ended the turn. A reply's
        calls are read as it streams (``ReplyReader``): only the text before them is
        passed on as it comes."""
        handle = await self._generation.start(request)
        live.request_id = handle.request_id
        asked = time.time()
        offered = turn.tools is not None and turn.tools.offered
        reader = ReplyReader(self._tokenizer.tool_format if offered else None, new_call_id)
        async with contextlib.aclosing(handle.events()) as events:  # cut short by a delete
            async for event in events:
                if live.deleted:
                    raise AgentDeletedError(live.agent_id, live.namespace)
                if isinstance(event, GenerationResult):
                    rest, answer = reader.finish()
                    if rest:
                        yield TextDelta(rest)
                    records = [*_asked(turn, asked), _answered(answer)]
                    keep = functools.partial(
                        self._metadata.append_messages,
                        live.namespace,
                        live.agent_id,
                        records,
                        lease=lease,
                    )
                    await _whole(self._cache.keeping(live.namespace, live.agent_id, keep))
                    yield CommittedReply(
                        event.request_id,
                        answer.content,
                        event.finish_reason,
                        event.usage,
                        event.stats,
                        event.stop_string,
                        place=earlier + len(records),
                        calls=answer.calls,
                    )
                elif isinstance(event, TextDelta):
                    shown = reader.feed(event.text)
                    if shown:
                        yield TextDelta(shown)

    async def _request(
        self, namespace: str, agent_id: str, turn: Turn
    ) -> tuple[GenerationInput, int]:
        """The whole conversation with the new message, checked against the context; and
        how many messages the transcript holds before it."""
        record = await self._record(namespace, agent_id)
        history = await self._metadata.messages(namespace, agent_id)
        chat = [_chat_message(m) for m in history]
        if record.system_prompt:
            chat.insert(0, ChatMessage("system", record.system_prompt))
        chat.extend(_chat_message(m) for m in _asked(turn, 0.0))
        _check_answers(history, turn)
        tools = turn.tools.tools if turn.tools else ()
        use = turn.tools
        request = GenerationInput(
            tuple(self._tokenizer.render_chat(chat, scope=namespace, tools=tools)),
            namespace,
            agent_id,
            turn.max_tokens,
            turn.sampling,
            turn.stop,
            turn.priority,
            (self._tokenizer.tool_format.constraint(use) if use else None) or turn.constraint,
        )
        try:
            self._generation.check(request)
        except PromptTooLongError as error:
            raise _outgrown(error, agent_id) from None
        return request, len(history)

    @contextlib.contextmanager
    def _tracked(self, live: _LiveTurn) -> Iterator[None]:
        self._track(live)
        try:
            yield
        finally:
            self._untrack(live)

    def _track(self, live: _LiveTurn) -> None:
        key = (live.namespace, live.agent_id)
        live.deleted = key in self._deleting
        self._live.setdefault(key, set()).add(live)

    def _untrack(self, live: _LiveTurn) -> None:
        key = (live.namespace, live.agent_id)
        turns = self._live.get(key, set())
        turns.discard(live)
        if not turns:
            self._live.pop(key, None)
        live.ended.set()

    async def _record(self, namespace: str, agent_id: str) -> AgentRecord:
        record = await self._metadata.agent(namespace, agent_id)
        if record is None or record.anonymous:
            raise AgentNotFoundError(agent_id, namespace)
        return record

    async def _info(self, record: AgentRecord, n_messages: int) -> AgentInfo:
        blocks = await self._metadata.blocks(record.block_keys)
        hot = sum(1 for key in record.block_keys if key in self._cache.hot)
        state = CacheState(
            tokens=record.token_count,
            blocks=len(record.block_keys),
            hot_blocks=hot,
            disk_blocks=len(blocks),
            bytes_on_disk=sum(b.nbytes for b in blocks.values()),
        )
        return AgentInfo(
            record.namespace,
            record.agent_id,
            record.system_prompt,
            record.created_at,
            record.last_used,
            n_messages,
            state,
        )

    def _lock(self, namespace: str, agent_id: str) -> AbstractAsyncContextManager[None]:
        return self._locks.hold((namespace, agent_id))


def _outgrown(error: PromptTooLongError, agent_id: str) -> PromptTooLongError:
    if error.param == "max_tokens":  # the conversation fits; the reply asked for not
        return PromptTooLongError(
            f"{error}; ask for fewer max_tokens, or leave it out to get the room left",
            param="max_tokens",
        )
    if agent_id.startswith(INTERNAL_PREFIX):  # a response's: its front door names the field
        return PromptTooLongError(
            f"the conversation has outgrown the model's context with this input ({error})",
            param="content",
        )
    return PromptTooLongError(
        f"agent {agent_id!r} has outgrown the model's context with this message "
        f"({error}); start a new agent, or delete this one",
        param="content",
    )


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _asked(turn: Turn, when: float) -> list[MessageRecord]:
    if turn.items:
        return [dataclasses.replace(m, created_at=m.created_at or when) for m in turn.items]
    return [MessageRecord(turn.role, turn.content, when, tool_call_id=turn.tool_call_id)]


def _answered(answer: Reply) -> MessageRecord:
    if not answer.calls:
        return MessageRecord("assistant", answer.content, time.time())
    calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in answer.calls]
    return MessageRecord(
        "assistant", answer.content, time.time(), tool_calls=json.dumps(calls), raw=answer.raw
    )


def record_calls(record: MessageRecord) -> tuple[ToolCall, ...]:
    """A transcript message's tool calls."""
    if not record.tool_calls:
        return ()
    return tuple(
        ToolCall(c["id"], c["name"], c["arguments"]) for c in json.loads(record.tool_calls)
    )


def _chat_message(record: MessageRecord) -> ChatMessage:
    """A transcript message as the model reads it: a reply with calls as it was generated."""
    if record.raw is not None:
        return ChatMessage("assistant", record.raw)
    if record.role == "tool":
        return ChatMessage("tool", record.content, tool_call_id=record.tool_call_id)
    return ChatMessage(record.role, record.content, tool_calls=record_calls(record))


def _check_answers(history: list[MessageRecord], turn: Turn) -> None:
    """A tool result answers a call of the agent's transcript (or of the turn's items
    before it)."""
    called = {c.id for m in history for c in record_calls(m)}
    if turn.tool_call_id is not None and turn.tool_call_id not in called:
        raise InvalidRequestError(
            f"tool_call_id {turn.tool_call_id!r} answers no call of this agent's replies",
            param="tool_call_id",
        )
    for index, item in enumerate(turn.items):
        called.update(c.id for c in record_calls(item))
        if item.tool_call_id is not None and item.tool_call_id not in called:
            raise InvalidRequestError(
                f"input[{index}]: call_id {item.tool_call_id!r} answers no function_call before it",
                param="input",
            )


async def _whole(commit: Coroutine[Any, Any, None]) -> None:
    """Run a commit to its end even if the caller is cancelled meanwhile (its client went
    away): cancelled halfway, the database's thread could still commit after the agent's
    lock was let go, and a retry would read the history without the turn, then add it again."""
    task = asyncio.ensure_future(commit)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise
