"""The shared block tier on Redis (redis-py, synchronous: called from worker threads).

Each block is one Redis hash under ``semantic:block:<chain key>``: the block file's exact
bytes (``data``) beside its content address and checksum (``namespace``, ``fingerprint``,
``parent``, ``tokens`` as packed uint32, ``checksum``), so ``redis-cli HGETALL`` shows what a
block is and whose. Redis may evict any key at any time (``maxmemory`` with an LRU policy):
a missing hash is a miss. A hash missing a field is treated as missing too.

Each namespace's blocks are also listed, for its quota: ``semantic:ns-used:<namespace>``
(a sorted set of its chain keys by last use, wall-clock seconds) and
``semantic:ns-bytes:<namespace>`` (a hash of their sizes), the namespaces in
``semantic:namespaces``. A block Redis evicted itself stays listed until the namespace's
usage is next read, which drops it.

Redis that cannot be reached never holds a request up: reads time out after ``timeout_s``
(pushes, off the request path, after ``write_timeout_s``), redis-py's own retries are off,
and after a failure every call answers at once (a miss, False) until a backoff has passed;
then one call tries again, and the wait doubles (up to ``MAX_BACKOFF_S``) while Redis stays
away.
"""

from __future__ import annotations

import logging
import threading
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.typing import EncodableT, FieldT

from semantic.ports.shared_blocks import SharedBlock, SharedHead, SharedUsage

log = logging.getLogger(__name__)

T = TypeVar("T")

PREFIX = "semantic:block:"
USED_PREFIX = "semantic:ns-used:"
BYTES_PREFIX = "semantic:ns-bytes:"
NAMESPACES = "semantic:namespaces"
"""The namespaces listed (a set): the tier's count of blocks leaves their two lists out."""
TIMEOUT_S = 0.5
"""Socket timeout of each exchange: a request's restore waits at most about this long on a
Redis that went away (then the backoff answers at once). 0.25 s was too short on this
2-core VM under load: a busy redis-server sending a 12 MB block took longer, and the tier
was taken for unreachable."""
CONNECT_TIMEOUT_S = 0.25
"""A Redis host that does not answer at all is given up on sooner than a slow reply."""
WRITE_TIMEOUT_S = 5.0
"""Socket timeout of pushes and deletions: they run off the request path, and a 12 MB push
to a redis-server starved of CPU (load 11 on this 2-core VM) outlasted 0.5 s."""
READ_SIZE = 1 << 20
"""Bytes asked of the socket at a time: blocks are ~12 MB, and redis-py's default (32 KB)
made reading one cost several times more."""
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 5.0
_HEAD = (b"parent", b"namespace", b"fingerprint", b"tokens", b"checksum")
_UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, OSError)


def redis_key(key: str) -> str:
    return PREFIX + key


class RedisSharedBlocks:
    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = TIMEOUT_S,
        write_timeout_s: float = WRITE_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._client = _client(url, timeout_s)
        self._writer = _client(url, write_timeout_s)
        self._url = url
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._reachable = True
        self._retry_at = 0.0
        self._backoff = FIRST_BACKOFF_S

    @property
    def reachable(self) -> bool:
        return self._reachable

    def put(self, block: SharedBlock) -> bool:
        head = block.head
        fields: dict[FieldT, EncodableT] = {
            "parent": head.parent_key,
            "namespace": head.namespace,
            "fingerprint": head.fingerprint,
            "tokens": array("I", head.tokens).tobytes(),
            "checksum": head.checksum,
            "data": block.data,
        }

        def store() -> bool:
            name = redis_key(head.key)
            if self._writer.exists(name):
                return True
            pipe = self._writer.pipeline(transaction=True)
            pipe.hset(name, mapping=fields)
            pipe.zadd(USED_PREFIX + head.namespace, {head.key: self._wall()})
            pipe.hset(BYTES_PREFIX + head.namespace, head.key, len(block.data))
            pipe.sadd(NAMESPACES, head.namespace)
            pipe.execute()
            return True

        return self._call(store, False)

    def get(self, key: str) -> SharedBlock | None:
        def fetch() -> SharedBlock | None:
            values = self._client.hmget(redis_key(key), [*_HEAD, b"data"])
            head = _head(key, values[:-1])
            data = values[-1]
            if head is None or not isinstance(data, bytes):
                return None
            self._client.zadd(USED_PREFIX + head.namespace, {key: self._wall()}, xx=True)
            return SharedBlock(head, data)

        return self._call(fetch, None)

    def heads(self, keys: Sequence[str]) -> dict[str, SharedHead]:
        if not keys:
            return {}

        def fetch() -> dict[str, SharedHead]:
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                pipe.hmget(redis_key(key), list(_HEAD))
            found = {}
            for key, values in zip(keys, pipe.execute(), strict=True):
                head = _head(key, values)
                if head is not None:
                    found[key] = head
            return found

        return self._call(fetch, {})

    def discard(self, keys: Sequence[str]) -> None:
        if not keys:
            return

        def remove() -> None:
            pipe = self._writer.pipeline(transaction=False)
            for key in keys:
                pipe.hget(redis_key(key), "namespace")
            owners: dict[str, list[str]] = {}
            for key, owner in zip(keys, pipe.execute(), strict=True):
                if isinstance(owner, bytes):
                    owners.setdefault(owner.decode(errors="replace"), []).append(key)
            self._drop(keys, owners)

        self._call(remove, None)

    def held(self, namespace: str) -> int | None:
        return self._call(lambda: sum(self._listed(namespace).values()), None)

    def trim(self, namespace: str, limit: int) -> list[str]:
        def cut() -> list[str]:
            sizes = self._listed(namespace)
            excess = sum(sizes.values()) - limit
            dropped: list[str] = []
            for member in self._writer.zrange(USED_PREFIX + namespace, 0, -1):
                key = _text(member)
                if excess <= 0:
                    break
                if key in sizes:
                    excess -= sizes[key]
                    dropped.append(key)
            if dropped:
                self._drop(dropped, {namespace: dropped})
            return dropped

        return self._call(cut, [])

    def _listed(self, namespace: str) -> dict[str, int]:
        """The namespace's listed blocks that Redis still holds, by size (the ones it
        evicted itself are unlisted here)."""
        raw = self._writer.hgetall(BYTES_PREFIX + namespace)
        sizes = {_text(k): int(v) for k, v in raw.items()}
        pipe = self._writer.pipeline(transaction=False)
        for key in sizes:
            pipe.exists(redis_key(key))
        gone = [k for k, there in zip(sizes, pipe.execute(), strict=True) if not there]
        if gone:
            pipe = self._writer.pipeline(transaction=True)
            self._unlist(pipe, namespace, gone)
            pipe.execute()
        return {k: n for k, n in sizes.items() if k not in gone}

    def _drop(self, keys: Sequence[str], owners: Mapping[str, Sequence[str]]) -> None:
        """Blocks removed, and unlisted from their namespaces' lists, in one transaction."""
        pipe = self._writer.pipeline(transaction=True)
        pipe.delete(*(redis_key(k) for k in keys))
        for namespace, owned in owners.items():
            self._unlist(pipe, namespace, owned)
        pipe.execute()

    @staticmethod
    def _unlist(pipe: redis.client.Pipeline, namespace: str, keys: Sequence[str]) -> None:
        pipe.zrem(USED_PREFIX + namespace, *keys)
        pipe.hdel(BYTES_PREFIX + namespace, *keys)

    def usage(self) -> SharedUsage | None:
        def read() -> SharedUsage:
            memory = self._client.info("memory")
            keys = int(self._client.dbsize())  # a database given to the tier: its keys
            listed = int(self._client.scard(NAMESPACES))
            blocks = max(0, keys - 2 * listed - (1 if listed else 0))
            limit = int(memory.get("maxmemory", 0))
            return SharedUsage(blocks, int(memory["used_memory"]), limit or None)

        return self._call(read, None)

    def probe(self) -> bool:
        with self._lock:
            self._retry_at = 0.0
        return self._call(lambda: bool(self._client.ping()), False)

    def close(self) -> None:
        self._client.close()
        self._writer.close()

    def _call(self, work: Callable[[], T], otherwise: T) -> T:
        """``work`` unless Redis failed less than a backoff ago; a failure to reach it
        starts (or lengthens) the backoff; any other Redis error is logged, the call fails."""
        with self._lock:
            if not self._reachable and self._clock() < self._retry_at:
                return otherwise
        try:
            result = work()
        except _UNREACHABLE as error:
            self._failed(error)
            return otherwise
        except redis.RedisError as error:  # reached, but refused (out of memory, say)
            log.warning("the shared block tier refused a command: %s", error)
            return otherwise
        with self._lock:
            if not self._reachable:
                log.info("the shared block tier at %s answers again", _hidden(self._url))
            self._reachable = True
            self._backoff = FIRST_BACKOFF_S
        return result

    def _failed(self, error: Exception) -> None:
        with self._lock:
            if self._reachable:
                log.warning(
                    "the shared block tier at %s is unreachable (%s); serving from this "
                    "instance's own tiers",
                    _hidden(self._url),
                    error,
                )
            else:
                self._backoff = min(MAX_BACKOFF_S, self._backoff * 2)
            self._reachable = False
            self._retry_at = self._clock() + self._backoff


def _client(url: str, timeout_s: float) -> redis.Redis:
    """Without redis-py's own retries: the backoff here decides when to try again."""
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=min(timeout_s, CONNECT_TIMEOUT_S),
        socket_read_size=READ_SIZE,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
    )


def _head(key: str, values: Sequence[object]) -> SharedHead | None:
    fields = [v for v in values if isinstance(v, bytes)]
    if len(fields) != len(_HEAD):
        return None
    parent, namespace, fingerprint, packed, checksum = fields
    if len(packed) % 4:
        return None
    tokens = array("I")
    tokens.frombytes(packed)
    try:
        return SharedHead(
            key,
            parent.decode(),
            namespace.decode(),
            fingerprint.decode(),
            tuple(tokens),
            checksum.decode(),
        )
    except UnicodeDecodeError:
        return None


def _text(value: object) -> str:
    """A key or field name as redis-py gives it (bytes: the client does not decode)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _hidden(url: str) -> str:
    """The URL without its password, for logs."""
    scheme, sep, rest = url.partition("://")
    if "@" not in rest:
        return url
    credentials, _, host = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{host}" if user else f"{scheme}{sep}***@{host}"
