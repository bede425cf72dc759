"""Domain errors.

Every failure a caller can act on has its own type here. The HTTP edge maps each type to a
status code once (see ``semantic.adapters.http.errors``); nothing inside the rings knows
about HTTP.
"""

from __future__ import annotations


class SemanticError(Exception):
    """Base of every error this product raises on purpose."""


class InvalidRequestError(SemanticError):
    """The caller asked for something malformed or out of range.

    ``param`` names the offending field when there is one, so an API edge can point at it.
    """

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class PromptTooLongError(InvalidRequestError):
    """The prompt plus the requested output does not fit the model's context."""


class PoolExhaustedError(SemanticError):
    """The block pool cannot hold what was asked, even after eviction."""

    def __init__(self, *, requested: int, free: int, capacity: int, what: str = "blocks") -> None:
        super().__init__(
            f"block pool exhausted: asked for {requested} {what}, {free} free "
            f"of {capacity} in total"
        )
        self.requested = requested
        self.free = free
        self.capacity = capacity


class NoRoomCameError(SemanticError):
    """Nothing ran, and no KV memory came free for a request within its patience: what
    held the memory may never let go. Retrying later is the caller's choice."""


class BlockOwnershipError(SemanticError):
    """An owner tried to release or share a block it does not hold."""


class PoolIntegrityError(SemanticError):
    """The pool's books do not balance: a bug, never a user error."""


class QueueFullError(SemanticError):
    """The request queue is at its bound; the caller should retry later."""

    def __init__(self, *, capacity: int, retry_after_s: float = 1.0) -> None:
        super().__init__(f"the request queue is full ({capacity} waiting); retry later")
        self.capacity = capacity
        self.retry_after_s = retry_after_s


class CacheCorruptionError(SemanticError):
    """Stored KV failed verification: missing, truncated or not matching its checksum."""


class IncompatibleCacheError(SemanticError):
    """Stored KV belongs to another model fingerprint, shape or dtype."""


class AgentNotFoundError(SemanticError):
    """No agent with this id exists in the namespace."""

    def __init__(self, agent_id: str, namespace: str = "default") -> None:
        super().__init__(f"agent {agent_id!r} not found in namespace {namespace!r}")
        self.agent_id = agent_id
        self.namespace = namespace


class ObjectNotFoundError(SemanticError):
    """No response, conversation or item with this id in the namespace (or it was
    deleted). ``param`` names the field that gave the id, if a field did."""

    def __init__(self, what: str, object_id: str, *, param: str | None = None) -> None:
        super().__init__(f"{what} {object_id!r} not found")
        self.param = param


class AgentDeletedError(AgentNotFoundError):
    """The agent was deleted while this turn was queued or running: nothing was kept."""

    def __init__(self, agent_id: str, namespace: str = "default") -> None:
        super().__init__(agent_id, namespace)
        self.args = (f"agent {agent_id!r} was deleted during this turn; nothing was kept",)


class AgentExistsError(SemanticError):
    """An agent with this id already exists in the namespace."""

    def __init__(self, agent_id: str, namespace: str = "default") -> None:
        super().__init__(f"agent {agent_id!r} already exists in namespace {namespace!r}")
        self.agent_id = agent_id
        self.namespace = namespace


class AgentKeepsTranscriptError(SemanticError):
    """A plain request names (by header) an agent whose transcript the server keeps: its
    KV would replace the transcript's, which would then be computed again after a restart."""

    def __init__(self, agent_id: str) -> None:
        super().__init__(
            f"agent {agent_id!r} keeps its transcript on the server: send its turns to "
            f"/v1/agents/{agent_id}/messages, or give this conversation another X-Agent-Id"
        )
        self.agent_id = agent_id


class ModelUnavailableError(SemanticError):
    """The model is not loaded yet (or failed to load); the caller may retry."""


class ShuttingDownError(SemanticError):
    """The server is draining and accepts no new work (or stopped before a request ended)."""


class StorageUnavailableError(SemanticError):
    """The metadata store cannot be read or written (a full or read-only disk, a locked
    database); nothing half-done was kept, and the caller may retry."""


class DiskFullError(StorageUnavailableError):
    """The disk holding the data directory has no room left for a write, and nothing the
    server keeps only as a cache is left to free there: the write was not kept. The message
    names the disk; the caller may retry once space is freed."""


class DataDirectoryUnusableError(SemanticError):
    """The data directory, or a part of it, is not what the server can keep data in (a
    file where a directory belongs, a database file that is not one)."""


class DataDirectoryInUseError(SemanticError):
    """Another process holds the data directory: two stores on one directory would collect
    each other's blocks."""

    def __init__(self, directory: str, holder: str) -> None:
        super().__init__(
            f"the data directory {directory} is in use by another semantic process "
            f"(pid {holder}); stop it, or give this one another --data-dir"
        )
        self.directory = directory


class AgentBusyError(SemanticError):
    """Another instance holds the agent's lease (it is running a turn there) and did not
    let it go while this request waited; the caller may retry after ``retry_after_s``."""

    def __init__(self, agent_id: str, namespace: str, retry_after_s: float) -> None:
        super().__init__(
            f"agent {agent_id!r} is busy on another instance (namespace {namespace!r}); "
            f"retry in {max(1, round(retry_after_s))} s"
        )
        self.agent_id = agent_id
        self.namespace = namespace
        self.retry_after_s = retry_after_s


class LeaseLostError(SemanticError):
    """A write of the agent's transcript or chain carried a lease epoch that is no longer
    current: this instance lost the agent (paused past its lease, say) and another took it.
    Nothing of the write was kept."""

    def __init__(self, agent_id: str, namespace: str) -> None:
        super().__init__(
            f"this instance lost agent {agent_id!r}'s lease (namespace {namespace!r}) to "
            "another instance before the turn was committed; nothing of the turn was kept, "
            "send it again"
        )
        self.agent_id = agent_id
        self.namespace = namespace
