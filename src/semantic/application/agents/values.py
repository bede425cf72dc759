"""What the agent use case takes and gives: a turn, an agent's info, a committed reply.

Its own module so the front doors (HTTP routes, the Responses service) read the shapes they
build and render without the service that runs them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from semantic.application.chat.generation import GenerationResult
from semantic.application.chat.tool_replies import Call
from semantic.domain.constraints import OutputConstraint
from semantic.domain.context_edits import ContextPolicy
from semantic.domain.generation import GREEDY, Priority, SamplingParams
from semantic.domain.retention import Retention
from semantic.domain.tools import ToolUse
from semantic.ports.leases import Lease
from semantic.ports.metadata_store import AgentRecord, BlockRecord, MessageRecord

INTERNAL_PREFIX = "~"
"""Agents the server makes for itself (a response's, a conversation's): never a client's
agent id, never listed."""


@dataclass(frozen=True, slots=True)
class CacheState:
    """Where an agent's KV is: its blocks, how many are in memory, and on disk."""

    tokens: int
    blocks: int
    hot_blocks: int
    disk_blocks: int
    bytes_on_disk: int

    @classmethod
    def of(cls, record: AgentRecord, on_disk: Mapping[str, BlockRecord], hot: int) -> CacheState:
        """``record``'s blocks, ``on_disk`` those the metadata knows, ``hot`` in memory."""
        return cls(
            tokens=record.token_count,
            blocks=len(record.block_keys),
            hot_blocks=hot,
            disk_blocks=len(on_disk),
            bytes_on_disk=sum(b.nbytes for b in on_disk.values()),
        )


@dataclass(frozen=True, slots=True)
class AgentInfo:
    namespace: str
    agent_id: str
    system_prompt: str | None
    created_at: float
    last_used: float
    messages: int
    cache: CacheState
    context: ContextPolicy | None = None
    retention: Retention = field(default_factory=Retention)

    @property
    def ttl_ends_at(self) -> float | None:
        """Wall-clock time its KV leaves memory unless used before (None: no TTL)."""
        ttl = self.retention.ttl_seconds
        return None if ttl is None else self.last_used + ttl

    @classmethod
    def of(cls, record: AgentRecord, n_messages: int, cache: CacheState) -> AgentInfo:
        return cls(
            record.namespace,
            record.agent_id,
            record.system_prompt,
            record.created_at,
            record.last_used,
            n_messages,
            cache,
            None
            if record.context_policy is None
            else ContextPolicy.from_json(record.context_policy),
            Retention.from_json(record.retention),
        )


@dataclass(frozen=True, slots=True)
class TurnStarted:
    """A turn's request is queued: nothing can refuse it any more with an error code, so a
    front door may open its stream now (the Responses API sends ``response.created`` at
    once, not with the first token)."""

    request_id: str


@dataclass(frozen=True, slots=True)
class CommittedReply(GenerationResult):
    """A turn's result once its messages are committed: the reply is message ``place`` of
    the transcript (``msg_<place>``), so a client can page on from it."""

    place: int = 0
    calls: tuple[Call, ...] = ()
    """The reply's tool calls (``text`` is then the text before them)."""
    rendered: str = ""
    """The prompt's mark (``prompt_marks``), for a branch's next turn to find it again."""
    cut_in_a_call: bool = False
    """It ended (``max_tokens``) inside a call: its calls are not all whole."""
    lease: Lease | None = None
    """The lease the turn committed under: what else belongs to the turn (a response's
    objects) is written under it, and refused by the database once another holds it."""

    @property
    def whole_calls(self) -> bool:
        """It ends in calls, all of them whole (``tool_calls``, not ``length``)."""
        return bool(self.calls) and not self.cut_in_a_call


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
    logprobs: int | None = None
    """Each token's log-probability with that many alternatives; None: none."""

    @property
    def role(self) -> str:
        return "user" if self.tool_call_id is None else "tool"
