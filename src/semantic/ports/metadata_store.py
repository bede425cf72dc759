"""The metadata store's ports, one by role: the database itself, agents and their block
lists, block records, transcripts, and remembered replies.

One database holds them all, opened and closed by the composition root (the SQL adapter
implements every role on one engine, so a turn's writes share its transactions); each
consumer names only the roles it uses, and the composition root hands it the same store
for each.

The writes of an agent's chain and transcript take the ``lease`` they are made under
(instances sharing the database): each checks it in its own transaction and raises
``LeaseLostError``, keeping nothing, once its epoch is no longer current. ``None``: one
instance, no leases."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from semantic.ports.leases import Lease


@dataclass(frozen=True, slots=True)
class BlockRecord:
    key: str
    parent_key: str
    namespace: str
    tokens: tuple[int, ...]
    nbytes: int
    checksum: str
    ref_count: int = 0
    quarantined: bool = False

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True, slots=True)
class AgentRecord:
    namespace: str
    agent_id: str
    block_keys: tuple[str, ...] = ()
    token_count: int = 0
    system_prompt: str | None = None
    anonymous: bool = False
    created_at: float = 0.0
    last_used: float = 0.0
    keeps_transcript: bool = False
    """Made by the agents API (created or forked): plain requests may not name it."""
    context_policy: str | None = None
    """The agent's ``ContextPolicy`` as JSON (None: a conversation past the window is
    refused)."""
    forked_from: str | None = None
    """The agent this one was forked from (its lineage; the source may since be gone)."""
    retention: str | None = None
    """Its ``Retention`` hints as JSON (None: the defaults)."""


@dataclass(frozen=True, slots=True)
class MessageRecord:
    role: str
    content: str
    created_at: float = 0.0
    tool_calls: str | None = None
    """An assistant's calls as JSON (``[{"id", "name", "arguments"}]``)."""
    tool_call_id: str | None = None
    """A tool result: the call it answers."""
    raw: str | None = None
    """An assistant turn with calls: the text the model wrote, rendered again as it was."""


class AgentRecords(Protocol):
    """Agents and their block lists. ``save_agent_blocks`` is one transaction: the new
    blocks' rows and the agent's new block list commit together, reference counts follow,
    and blocks that no agent references any more are returned so their files can be
    deleted."""

    async def agent(self, namespace: str, agent_id: str) -> AgentRecord | None: ...

    async def agents(self, namespace: str | None = None) -> list[AgentRecord]: ...

    async def anonymous_agents_ending_at(
        self, namespace: str, keys: Sequence[str]
    ) -> list[AgentRecord]:
        """Anonymous agents of the namespace whose block list ends with one of ``keys``."""
        ...

    async def create_agent(self, agent: AgentRecord) -> None:
        """Raises ``AgentExistsError`` if the id is taken in its namespace."""
        ...

    async def fork_agent(
        self, namespace: str, source_id: str, new_id: str, system_prompt: str | None
    ) -> AgentRecord | None:
        """In one transaction, a new agent (``keeps_transcript``, ``system_prompt``) holding
        the source's blocks and a copy of its messages; None if the source is gone, and
        ``AgentExistsError`` if ``new_id`` is taken."""
        ...

    async def save_agent_blocks(
        self,
        agent: AgentRecord,
        new_blocks: Sequence[BlockRecord],
        *,
        expected: Sequence[str] | None = None,
        lease: Lease | None = None,
    ) -> list[str]:
        """Record ``new_blocks`` and make ``agent``'s block list its ``block_keys``; returns
        the keys no record references any more. ``expected`` (a cut): only while the record
        exists and still holds exactly those keys, checked by the database in the write's
        transaction, so a cut neither brings back an agent deleted since it was read nor
        undoes a turn saved since, by this instance or another."""
        ...

    async def delete_agent(
        self,
        namespace: str,
        agent_id: str,
        *,
        expected: Sequence[str] | None = None,
        lease: Lease | None = None,
    ) -> list[str]:
        """Delete the agent and its transcript; returns keys no agent references any more.
        ``expected``: as for ``save_agent_blocks``."""
        ...

    async def set_retention(self, namespace: str, agent_id: str, retention: str) -> None:
        """The agent's retention hints (JSON); an agent plain requests name that has no
        record yet gets one (it keeps no transcript), so its hints outlive a restart."""
        ...


class BlockRecords(Protocol):
    """The records of the block files: what each holds, who shares it, what is on disk."""

    @property
    def created(self) -> bool:
        """Whether ``open`` created the database (there was none, or it held no schema):
        its rows then know none of the block files already on disk."""
        ...

    async def blocks(self, keys: Sequence[str]) -> dict[str, BlockRecord]: ...

    async def children(self, parent_key: str) -> list[BlockRecord]: ...

    async def mark_blocks_shared(self, keys: Sequence[str]) -> None:
        """Record that the shared tier holds these blocks (rows gone since are skipped)."""
        ...

    async def quarantine_block(self, key: str) -> None:
        """Mark a block bad: lookups stop before it until a save replaces it."""
        ...

    async def unreferenced_blocks(self) -> list[str]: ...

    async def delete_blocks(self, keys: Sequence[str]) -> None: ...

    async def all_block_keys(self) -> set[str]: ...

    async def total_block_bytes(self) -> int: ...

    async def block_bytes_by_namespace(self) -> dict[str, int]:
        """Bytes of the block files each namespace's rows name (a tenant's use on disk)."""
        ...


class Transcripts(Protocol):
    """Agents' messages, and a turn's agent committed with its reply."""

    async def append_messages(
        self,
        namespace: str,
        agent_id: str,
        messages: Sequence[MessageRecord],
        *,
        lease: Lease | None = None,
    ) -> None: ...

    async def messages(self, namespace: str, agent_id: str) -> list[MessageRecord]: ...

    async def transcript(
        self, namespace: str, agent_id: str
    ) -> tuple[AgentRecord, list[MessageRecord]] | None:
        """The agent and its messages, read together (None: no such agent)."""
        ...

    async def message_counts(self, namespace: str) -> dict[str, int]:
        """Each agent's transcript length in the namespace (agents with none are absent)."""
        ...

    async def commit_branch(
        self,
        agent: AgentRecord,
        transcript: Sequence[MessageRecord],
        *,
        lease: Lease | None = None,
    ) -> None:
        """In one transaction, the agent (``keeps_transcript``, its ``system_prompt``)
        holding ``agent.block_keys`` (up to the first whose block is gone) and
        ``transcript`` as its messages: a turn whose agent is made with its reply. A row a
        save already made for it keeps its block list and takes the rest."""
        ...


class ReplyMemory(Protocol):
    """Generated replies with tool calls, kept by key so the next turn renders them again."""

    async def remember_reply(self, namespace: str, key: str, body: str) -> None:
        """Keep ``body`` (a generated reply with tool calls, as JSON) under ``key``."""
        ...

    async def remembered_reply(self, namespace: str, key: str) -> str | None: ...
