"""In-memory fakes of the block store and metadata store ports."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from semantic.domain.blocks import KVBlock
from semantic.domain.errors import (
    AgentExistsError,
    CacheCorruptionError,
    DiskFullError,
    LeaseLostError,
)
from semantic.ports.block_store import LayerPayload, StoredFile
from semantic.ports.leases import Lease
from semantic.ports.metadata_store import AgentRecord, BlockRecord, MessageRecord
from semantic.ports.object_store import StoredObject


class FakeBlockStore:
    def __init__(self) -> None:
        self.files: dict[str, tuple[list[LayerPayload], str]] = {}
        self.corrupted: set[str] = set()
        self.quarantined: list[str] = []
        self.saves: list[str] = []
        self.loads: list[str] = []
        self.full = False  # a full disk: every save fails
        self.free: int | None = None  # bytes free on its file system, if known
        self.released = 0  # calls of release_space
        self.capacity: int | None = None  # a disk of this size: free space follows the files
        self.taken = 0  # bytes of it another program holds
        self.headroom = 0  # bytes of it the headroom file holds

    def save(self, key: str, layers: Sequence[KVBlock]) -> StoredFile:
        room = self.free_bytes()
        if self.full or (self.capacity is not None and (room or 0) < 10 * len(layers)):
            raise OSError(28, "No space left on device")
        payloads = [LayerPayload(b.layer, b.start, b.n_tokens, b.payload) for b in layers]
        checksum = f"sum-{key[:8]}"
        self.files[key] = (payloads, checksum)
        self.saves.append(key)
        return StoredFile(10 * len(layers), checksum)

    def load(self, key: str, checksum: str) -> list[LayerPayload]:
        self.loads.append(key)
        if key not in self.files:
            raise CacheCorruptionError(f"{key} is missing")
        payloads, stored = self.files[key]
        if key in self.corrupted or stored != checksum:
            raise CacheCorruptionError(f"{key} does not match its checksum")
        return list(payloads)

    def has(self, key: str) -> bool:
        return key in self.files

    def file_bytes(self, key: str, checksum: str) -> bytes | None:
        return None  # no bytes to share: the shared tier runs on real files only

    def load_bytes(self, key: str, data: bytes, checksum: str) -> list[LayerPayload]:
        raise CacheCorruptionError("the fake store reads no files from elsewhere")

    def quarantine(self, key: str) -> None:
        self.quarantined.append(key)
        self.files.pop(key, None)

    def delete(self, key: str) -> None:
        self.files.pop(key, None)

    def keys(self) -> set[str]:
        return set(self.files)

    def remove_temporaries(self) -> int:
        return 0

    @property
    def space(self) -> FakeBlockStore:
        return self

    def free_bytes(self) -> int | None:
        if self.capacity is None:
            return self.free
        used = sum(10 * len(payloads) for payloads, _ in self.files.values())
        return max(0, self.capacity - self.taken - self.headroom - used)

    def release_space(self, *, headroom: bool) -> int:
        self.released += 1
        freed, self.headroom = (self.headroom, 0) if headroom else (0, self.headroom)
        return freed

    def keep_headroom(self, *, leaving: int) -> bool:
        room = self.free_bytes()
        if not self.headroom and self.capacity is not None and (room or 0) >= 10 + leaving:
            self.headroom = 10
        return bool(self.headroom)


class FakeMetadataStore:
    def __init__(self, disk: FakeBlockStore | None = None) -> None:
        self.disk = disk  # with a capacity: writes need a free byte on it, as SQLite's do
        self.block_rows: dict[str, BlockRecord] = {}
        self.agent_rows: dict[tuple[str, str], AgentRecord] = {}
        self.transcripts: dict[tuple[str, str], list[MessageRecord]] = {}
        self.replies: dict[tuple[str, str], str] = {}
        self.shared: set[str] = set()
        self.clock = 0.0
        self.opened = 0
        self.write_leases: list[Lease | None] = []  # the lease each fenced write carried
        self.lost: set[tuple[str, str]] = set()  # agents whose leases writes find lost

    @property
    def created(self) -> bool:
        return self.opened == 1

    async def open(self) -> None:
        self.opened += 1

    async def close(self) -> None:
        pass

    async def blocks(self, keys: Sequence[str]) -> dict[str, BlockRecord]:
        return {k: self.block_rows[k] for k in keys if k in self.block_rows}

    async def children(self, parent_key: str) -> list[BlockRecord]:
        return [r for r in self.block_rows.values() if r.parent_key == parent_key]

    async def save_agent_blocks(
        self,
        agent: AgentRecord,
        new_blocks: Sequence[BlockRecord],
        *,
        expected: Sequence[str] | None = None,
        lease: Lease | None = None,
    ) -> list[str]:
        self._fence(lease)
        self._write()
        if not self._holds(agent.namespace, agent.agent_id, expected):
            return []
        for record in new_blocks:
            self.block_rows[record.key] = dataclasses.replace(record, quarantined=False)
        old = self.agent_rows.get((agent.namespace, agent.agent_id))
        self.clock += 1
        self.agent_rows[(agent.namespace, agent.agent_id)] = dataclasses.replace(
            agent,
            system_prompt=old.system_prompt if old else agent.system_prompt,
            keeps_transcript=old.keeps_transcript if old else agent.keeps_transcript,
            last_used=agent.last_used or self.clock,
        )
        return self._recount(set(old.block_keys if old else ()) | set(agent.block_keys))

    async def mark_blocks_shared(self, keys: Sequence[str]) -> None:
        self.shared.update(k for k in keys if k in self.block_rows)

    async def quarantine_block(self, key: str) -> None:
        self.block_rows[key] = dataclasses.replace(self.block_rows[key], quarantined=True)

    async def agent(self, namespace: str, agent_id: str) -> AgentRecord | None:
        return self.agent_rows.get((namespace, agent_id))

    async def agents(self, namespace: str | None = None) -> list[AgentRecord]:
        return [a for a in self.agent_rows.values() if namespace in (None, a.namespace)]

    async def anonymous_agents_ending_at(
        self, namespace: str, keys: Sequence[str]
    ) -> list[AgentRecord]:
        ends = set(keys)
        return [
            a
            for a in self.agent_rows.values()
            if a.namespace == namespace
            and a.anonymous
            and a.block_keys
            and a.block_keys[-1] in ends
        ]

    async def create_agent(self, agent: AgentRecord) -> None:
        self._write()
        if (agent.namespace, agent.agent_id) in self.agent_rows:
            raise AgentExistsError(agent.agent_id, agent.namespace)
        self.clock += 1
        self.agent_rows[(agent.namespace, agent.agent_id)] = dataclasses.replace(
            agent, last_used=self.clock
        )

    async def set_retention(self, namespace: str, agent_id: str, retention: str) -> None:
        self._write()
        found = self.agent_rows.get((namespace, agent_id)) or AgentRecord(namespace, agent_id)
        self.agent_rows[(namespace, agent_id)] = dataclasses.replace(found, retention=retention)

    async def fork_agent(
        self, namespace: str, source_id: str, new_id: str, system_prompt: str | None
    ) -> AgentRecord | None:
        self._write()
        source = self.agent_rows.get((namespace, source_id))
        if source is None or source.anonymous:
            return None
        if (namespace, new_id) in self.agent_rows:
            raise AgentExistsError(new_id, namespace)
        self.clock += 1
        fork = dataclasses.replace(
            source,
            agent_id=new_id,
            system_prompt=system_prompt,
            keeps_transcript=True,
            created_at=self.clock,
            last_used=self.clock,
            forked_from=source_id,
        )
        self.agent_rows[(namespace, new_id)] = fork
        self.transcripts[(namespace, new_id)] = list(
            self.transcripts.get((namespace, source_id), [])
        )
        self._recount(set(source.block_keys))
        return fork

    async def commit_branch(
        self,
        agent: AgentRecord,
        transcript: Sequence[MessageRecord],
        *,
        lease: Lease | None = None,
    ) -> None:
        self._fence(lease)
        self._write()
        where = (agent.namespace, agent.agent_id)
        old = self.agent_rows.get(where)
        self.clock += 1
        if old is not None:  # a save made it first: its block list stays
            made = dataclasses.replace(
                old, system_prompt=agent.system_prompt, keeps_transcript=True
            )
        else:
            keys: list[str] = []
            for key in agent.block_keys:
                if key not in self.block_rows:
                    break
                keys.append(key)
            made = dataclasses.replace(
                agent,
                block_keys=tuple(keys),
                keeps_transcript=True,
                anonymous=False,
                created_at=self.clock,
                last_used=self.clock,
            )
        self.agent_rows[where] = made
        self.transcripts.setdefault(where, []).extend(transcript)
        self._recount(set(made.block_keys))

    async def delete_agent(
        self,
        namespace: str,
        agent_id: str,
        *,
        expected: Sequence[str] | None = None,
        lease: Lease | None = None,
    ) -> list[str]:
        self._fence(lease)
        self._write()
        if not self._holds(namespace, agent_id, expected):
            return []
        old = self.agent_rows.pop((namespace, agent_id), None)
        self.transcripts.pop((namespace, agent_id), None)
        return self._recount(set(old.block_keys) if old else set())

    def _holds(self, namespace: str, agent_id: str, expected: Sequence[str] | None) -> bool:
        if expected is None:
            return True
        found = self.agent_rows.get((namespace, agent_id))
        return found is not None and found.block_keys == tuple(expected)

    async def unreferenced_blocks(self) -> list[str]:
        return [k for k, r in self.block_rows.items() if r.ref_count <= 0]

    async def delete_blocks(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.block_rows.pop(key, None)

    async def all_block_keys(self) -> set[str]:
        return set(self.block_rows)

    async def total_block_bytes(self) -> int:
        return sum(r.nbytes for r in self.block_rows.values())

    async def block_bytes_by_namespace(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for row in self.block_rows.values():
            found[row.namespace] = found.get(row.namespace, 0) + row.nbytes
        return found

    async def append_messages(
        self,
        namespace: str,
        agent_id: str,
        records: Sequence[MessageRecord],
        *,
        lease: Lease | None = None,
    ) -> None:
        self._fence(lease)
        self._write()
        self.transcripts.setdefault((namespace, agent_id), []).extend(records)

    async def messages(self, namespace: str, agent_id: str) -> list[MessageRecord]:
        return list(self.transcripts.get((namespace, agent_id), []))

    async def transcript(
        self, namespace: str, agent_id: str
    ) -> tuple[AgentRecord, list[MessageRecord]] | None:
        record = self.agent_rows.get((namespace, agent_id))
        if record is None:
            return None
        return record, await self.messages(namespace, agent_id)

    async def remember_reply(self, namespace: str, key: str, body: str) -> None:
        self.replies.setdefault((namespace, key), body)

    async def remembered_reply(self, namespace: str, key: str) -> str | None:
        return self.replies.get((namespace, key))

    async def message_counts(self, namespace: str) -> dict[str, int]:
        return {a: len(m) for (ns, a), m in self.transcripts.items() if ns == namespace and m}

    def _fence(self, lease: Lease | None) -> None:
        self.write_leases.append(lease)
        if lease is not None and (lease.namespace, lease.agent_id) in self.lost:
            raise LeaseLostError(lease.agent_id, lease.namespace)

    def _write(self) -> None:
        if self.disk is not None and self.disk.capacity is not None and not self.disk.free_bytes():
            raise DiskFullError("the disk holding the data directory /fake is full")

    def _recount(self, keys: set[str]) -> list[str]:
        orphans = []
        for key in keys:
            count = sum(key in a.block_keys for a in self.agent_rows.values())
            if key in self.block_rows:
                self.block_rows[key] = dataclasses.replace(self.block_rows[key], ref_count=count)
            if count == 0:
                orphans.append(key)
                self.block_rows.pop(key, None)
        return orphans


class FakeObjectStore:
    """The stored-objects port in memory: by namespace, kind and id."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], StoredObject] = {}

    async def put_objects(
        self, namespace: str, objects: Sequence[StoredObject], *, lease: Lease | None = None
    ) -> None:
        for stored in objects:
            self.objects[(namespace, stored.kind, stored.object_id)] = stored

    async def stored_object(self, namespace: str, kind: str, object_id: str) -> StoredObject | None:
        return self.objects.get((namespace, kind, object_id))

    async def object_children(
        self, namespace: str, kind: str, parent_id: str
    ) -> list[StoredObject]:
        return [
            o
            for (n, k, _), o in self.objects.items()
            if (n, k) == (namespace, kind) and o.parent_id == parent_id
        ]

    async def objects_of_kind(self, namespace: str, kind: str) -> list[StoredObject]:
        return [o for (n, k, _), o in self.objects.items() if (n, k) == (namespace, kind)]

    async def delete_objects(self, namespace: str, kind: str, object_ids: Sequence[str]) -> int:
        gone = [
            key for key in self.objects if key[:2] == (namespace, kind) and key[2] in object_ids
        ]
        for key in gone:
            del self.objects[key]
        return len(gone)
