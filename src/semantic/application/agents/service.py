"""Stateful agents: the server keeps each agent's transcript and KV; clients send only the
new message. A reply is acknowledged only after it is committed with its question.

This module is the agents' lifecycle (create, list; fork and delete are ``forks``) and
their turns; the locks and leases around a turn are ``turn_gate``, the turn itself
``turns``, plain requests naming an agent ``plain_requests``, the transcript's rendering
``chat.transcript``, what a delete ends ``live_turns``, and the values ``values``."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

from semantic.application.agents.forks import AgentForks
from semantic.application.agents.leases import AgentLeases
from semantic.application.agents.live_turns import LiveTurns
from semantic.application.agents.plain_requests import PlainRequests
from semantic.application.agents.turn_gate import TurnGate
from semantic.application.agents.turns import TurnRunner
from semantic.application.agents.values import (
    INTERNAL_PREFIX,
    AgentInfo,
    CacheState,
    CommittedReply,
    Turn,
    TurnStarted,
)
from semantic.application.cache.store import AgentCacheStore
from semantic.application.chat.generation import (
    CheckedInput,
    GenerationHandle,
    GenerationInput,
    GenerationService,
)
from semantic.application.chat.prompt_marks import leading_tokens, marked
from semantic.application.chat.tool_replies import TurnEvent
from semantic.domain.chat import ChatMessage
from semantic.domain.context_edits import ContextPolicy
from semantic.domain.errors import (
    AgentKeepsTranscriptError,
    AgentNotFoundError,
    InvalidRequestError,
    PromptTooLongError,
)
from semantic.domain.retention import Retention
from semantic.ports.leases import Lease
from semantic.ports.metadata_store import (
    AgentRecord,
    AgentRecords,
    BlockRecords,
    MessageRecord,
    Transcripts,
)
from semantic.ports.tokenizer import Tokenizer


class AgentService:
    """The agents of every namespace: one turn of an agent at a time."""

    def __init__(
        self,
        generation: GenerationService,
        cache: AgentCacheStore,
        tokenizer: Tokenizer,
        *,
        agent_records: AgentRecords,
        block_records: BlockRecords,
        transcripts: Transcripts,
        leases: AgentLeases | None = None,
    ) -> None:
        """``leases``: instances share the database, and an agent's turns take its lease
        (None: this instance is the database's only one, its own locks are enough)."""
        self._generation = generation
        self._agent_records = agent_records
        self._block_records = block_records
        self._transcripts = transcripts
        self._cache = cache
        self._tokenizer = tokenizer
        self._gate = TurnGate(cache, LiveTurns(generation.cancel), leases)
        self._plain = PlainRequests(generation, self._agent_records, self._gate, cache.retention)
        self._runner = TurnRunner(generation, self._transcripts, cache, tokenizer)
        self._forks = AgentForks(self._gate, cache, agent_records)

    async def create(
        self,
        namespace: str,
        agent_id: str,
        system_prompt: str | None,
        context: ContextPolicy | None = None,
        retention: Retention | None = None,
    ) -> AgentInfo:
        """``context``: what a conversation past its trigger drops or clears (None: it is
        refused once it outgrows the window); ``retention``: how long its KV stays where."""
        self._check_system(namespace, agent_id, system_prompt)  # refused now, not each turn
        self._check_context(context)
        record = AgentRecord(
            namespace,
            agent_id,
            system_prompt=system_prompt,
            keeps_transcript=True,
            context_policy=None if context is None else context.to_json(),
            retention=None if retention is None else retention.to_json(),
        )
        await self._cache.keeping(
            namespace, agent_id, functools.partial(self._agent_records.create_agent, record)
        )
        self._cache.retention.set(namespace, agent_id, retention or Retention())
        return await self.get(namespace, agent_id)

    async def retain(
        self, namespace: str, agent_id: str, change: Mapping[str, Any], *, known: bool = False
    ) -> Retention:
        """The agent's retention hints with ``change`` set (a PATCH, a request's header or
        SDK fields), kept on its record; an agent plain requests name gets a record now.
        ``known``: the agent must exist (the agents API: 404 otherwise). A change that is
        refused changes nothing."""
        record = await self._agent_records.agent(namespace, agent_id)
        if (record is not None and record.anonymous) or (record is None and known):
            raise AgentNotFoundError(agent_id, namespace)
        if record is not None and record.keeps_transcript and not known:
            raise AgentKeepsTranscriptError(agent_id)  # as the plain request naming it is
        before = Retention.from_json(record.retention if record else None)
        after = before.changed(change)
        if after != before or record is None:
            await self._agent_records.set_retention(namespace, agent_id, after.to_json())
        self._cache.retention.set(namespace, agent_id, after)
        return after

    def _check_context(self, context: ContextPolicy | None) -> None:
        window = self._generation.limits.max_context
        if context is not None and context.trigger_tokens >= window:
            raise InvalidRequestError(
                f"context.trigger_tokens must be below the model's context of {window}",
                param="context",
            )

    def _check_system(self, namespace: str, agent_id: str, system_prompt: str | None) -> None:
        """An agent whose system prompt leaves no room for any turn is refused by name."""
        if not system_prompt:
            return
        try:
            chat = [ChatMessage("system", system_prompt)]
            prompt = tuple(self._tokenizer.render_chat(chat, scope=namespace))
            self._generation.check(GenerationInput(prompt, namespace, agent_id))
        except PromptTooLongError as error:
            raise PromptTooLongError(
                f"the system prompt leaves no room for a conversation: {error}",
                param="system_prompt",
            ) from None

    async def get(self, namespace: str, agent_id: str) -> AgentInfo:
        record = await self._record(namespace, agent_id)
        counts = await self._transcripts.message_counts(namespace)
        return await self._info(record, counts.get(agent_id, 0))

    async def start_plain(self, request: GenerationInput) -> GenerationHandle:
        """A plain (OpenAI or Anthropic) request, one naming an agent tracked like a turn."""
        return await self._plain.start(request)

    async def list_agents(
        self, namespace: str, after: str | None = None, limit: int | None = None
    ) -> tuple[list[AgentInfo], bool]:
        """The namespace's agents by id, those after ``after``, at most ``limit``; and
        whether more follow."""
        records = [
            r
            for r in await self._agent_records.agents(namespace)
            if not r.anonymous
            and not r.agent_id.startswith(INTERNAL_PREFIX)
            and (after is None or r.agent_id > after)
        ]
        page = records if limit is None else records[:limit]
        counts = await self._transcripts.message_counts(namespace)
        infos = [await self._info(r, counts.get(r.agent_id, 0)) for r in page]
        return infos, len(page) < len(records)

    async def internal_agents(self, prefix: str) -> list[tuple[str, str]]:
        """(namespace, agent id) of every agent, in any namespace, whose id starts with
        ``prefix`` (one of ``INTERNAL_PREFIX``'s), for their owner's sweep at start."""
        if not prefix.startswith(INTERNAL_PREFIX):
            raise ValueError(f"{prefix!r} names no internal agents")
        found = await self._agent_records.agents()
        return [(r.namespace, r.agent_id) for r in found if r.agent_id.startswith(prefix)]

    async def release(self, namespace: str, agent_id: str) -> tuple[AgentInfo, int]:
        """The agent's KV leaves memory now and stays on disk (an agent gone for a while:
        its memory serves others meanwhile, and its next turn restores from disk). Its
        blocks other agents share stay, as do blocks in use; its last turn's are saved
        first, so they can go too. The agent, and how many blocks left memory."""
        await self._cache.flush()
        record = await self._record(namespace, agent_id)
        stored = await self._block_records.blocks(record.block_keys)
        own = [key for key, block in stored.items() if block.ref_count <= 1]
        released = self._cache.demote(own)
        return await self.get(namespace, agent_id), released

    async def prefetch(self, namespace: str, agent_id: str) -> tuple[AgentInfo, int]:
        """The agent's stored KV loaded into memory ahead of its turn (from disk or the
        shared tier), so that turn starts as from memory; the agent, and how many tokens
        were loaded (0: all were in memory already)."""
        record = await self._record(namespace, agent_id)
        stored = await self._block_records.blocks(record.block_keys)
        tokens: list[int] = []
        for key in record.block_keys:
            if key not in stored:
                break
            tokens.extend(stored[key].tokens)
        _, loaded = await self._cache.prefetch(namespace, tokens) if tokens else (0, 0)
        return await self.get(namespace, agent_id), loaded

    async def delete(self, namespace: str, agent_id: str) -> None:
        """The agent and its branches, its live turns ended first (``AgentForks.delete``)."""
        await self._forks.delete(namespace, agent_id)

    async def fork(self, namespace: str, source_id: str, new_id: str) -> AgentInfo:
        """A new agent sharing every block and message of the source (``AgentForks.fork``)."""
        await self._forks.fork(namespace, source_id, new_id)
        return await self.get(namespace, new_id)

    async def messages(self, namespace: str, agent_id: str) -> list[MessageRecord]:
        await self._record(namespace, agent_id)
        return await self._transcripts.messages(namespace, agent_id)

    async def transcript(
        self, namespace: str, agent_id: str
    ) -> tuple[AgentRecord, list[MessageRecord]]:
        """The agent's record and messages, for a branch of it (``send_new``)."""
        found = await self._transcripts.transcript(namespace, agent_id)
        if found is None or found[0].anonymous:
            raise AgentNotFoundError(agent_id, namespace)
        return found

    async def send(
        self, namespace: str, agent_id: str, turn: Turn
    ) -> AsyncGenerator[TurnEvent, None]:
        """Append the user's message, generate the reply, commit both, then report the
        result. Turns of one agent run one at a time. On a full disk, cached KV makes room
        for the transcript; a turn that cannot be kept is refused (``DiskFullError``),
        never answered."""
        if not turn.content and turn.tool_call_id is None and not turn.items:
            raise InvalidRequestError("the message is empty", param="content")
        async with self._gate.turn(namespace, agent_id) as (live, lease):
            record = await self._record(namespace, agent_id)
            self._cache.retention.set(namespace, agent_id, Retention.from_json(record.retention))
            self._cache.tool_waits.returned(namespace, agent_id)
            request, earlier = await self._runner.request(record, turn)
            write = functools.partial(
                self._transcripts.append_messages, namespace, agent_id, lease=lease
            )
            async for event in _under(lease, self._runner.run(request, live, turn, earlier, write)):
                if isinstance(event, CommittedReply) and event.whole_calls:
                    await self._hold_for_tools(namespace, agent_id, event)
                if not isinstance(event, TurnStarted):  # its callers open no stream early
                    yield event

    async def _hold_for_tools(self, namespace: str, agent_id: str, reply: CommittedReply) -> None:
        saved = await self._agent_records.agent(namespace, agent_id)  # its new blocks too
        if saved is not None:
            tools = [call.name for call in reply.calls]
            self._cache.hold_for_tools(namespace, agent_id, tools, saved.block_keys)

    async def send_new(
        self,
        agent: AgentRecord,
        history: Sequence[MessageRecord],
        turn: Turn,
        *,
        keep: bool = True,
        rendered: str = "",
        truncate: bool = False,
    ) -> AsyncGenerator[TurnEvent | TurnStarted, None]:
        """A turn of an agent made with its reply: ``agent`` (with the block list it shares
        with the agent it branches from, nothing copied) and ``history`` as its transcript.
        Nothing is written before the reply, so a chain's next turn waits for no commit;
        the agent, ``history`` and the turn then commit in one transaction before the
        result is reported (``commit_branch``). ``keep=False`` commits nothing, and the
        turn's KV is saved as an anonymous request's.
        ``rendered``: the mark of the prompt that made the blocks ``agent`` starts from
        (``CommittedReply.rendered``), whose ids the rendering then takes for the text it
        repeats rather than tokenize it again (after a restart, the whole history).
        ``truncate``: a history that leaves the turn no room loses its oldest turns
        (``TurnRunner.fitted_history``) and the agent starts from no blocks."""
        async with self._gate.turn(agent.namespace, agent.agent_id) as (live, lease):
            hints = Retention.from_json(agent.retention)
            self._cache.retention.set(agent.namespace, agent.agent_id, hints)
            known = await self._known(agent, rendered) if rendered else ()
            try:
                request = self._new_request(agent, history, turn, known)
            except PromptTooLongError:
                fitted = self._runner.fitted_history(agent, history, turn) if truncate else None
                if fitted is None:
                    raise
                history = fitted
                agent = dataclasses.replace(agent, block_keys=(), token_count=0)
                request = self._new_request(agent, history, turn)
            if not keep:  # nothing a client can name stays: its KV stays as any anonymous
                # request's does, found again by prompt (as OpenAI caches store: false ones)
                anonymous = dataclasses.replace(request.request, agent_id=None)
                request = dataclasses.replace(request, request=anonymous)
            write = functools.partial(self._write_new, agent, history, keep, lease)
            events = self._runner.run(request, live, turn, len(history), write)
            async for event in _under(lease, events):
                yield event

    def prompt_tokens(
        self, agent: AgentRecord, history: Sequence[MessageRecord], turn: Turn
    ) -> int:
        """The length of the prompt ``send_new`` would render, nothing run."""
        return self._runner.prompt_tokens(agent, history, turn)

    async def _known(self, agent: AgentRecord, rendered: str) -> Sequence[int]:
        """The ids of the prompt ``rendered`` marks, from the agent's blocks (the metadata's
        copy in memory); none if the blocks do not start with exactly that prompt."""
        records = await self._block_records.blocks(agent.block_keys)
        return marked(self._cache.fingerprint, rendered, leading_tokens(agent, records))

    def _new_request(
        self,
        agent: AgentRecord,
        history: Sequence[MessageRecord],
        turn: Turn,
        known: Sequence[int] = (),
    ) -> CheckedInput:
        try:
            return self._runner.request_of(agent, history, turn, known)
        except PromptTooLongError:  # the system prompt alone, if it is what does not fit
            self._check_system(agent.namespace, agent.agent_id, agent.system_prompt)
            raise

    async def _write_new(
        self,
        agent: AgentRecord,
        history: Sequence[MessageRecord],
        keep: bool,
        lease: Lease | None,
        records: Sequence[MessageRecord],
    ) -> None:
        if keep:
            await self._transcripts.commit_branch(agent, [*history, *records], lease=lease)

    async def _record(self, namespace: str, agent_id: str) -> AgentRecord:
        record = await self._agent_records.agent(namespace, agent_id)
        if record is None or record.anonymous:
            raise AgentNotFoundError(agent_id, namespace)
        return record

    async def _info(self, record: AgentRecord, n_messages: int) -> AgentInfo:
        blocks = await self._block_records.blocks(record.block_keys)
        hot = sum(1 for key in record.block_keys if key in self._cache.hot)
        return AgentInfo.of(record, n_messages, CacheState.of(record, blocks, hot))


async def _under(
    lease: Lease | None, events: AsyncGenerator[TurnEvent | TurnStarted, None]
) -> AsyncGenerator[TurnEvent | TurnStarted, None]:
    """The turn's events, its committed reply naming the lease it committed under."""
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, CommittedReply):
                event = dataclasses.replace(event, lease=lease)  # noqa: PLW2901 (named anew)
            yield event
