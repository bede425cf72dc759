"""API keys, each bound to one namespace or to all of them (an admin key).

A namespace isolates tenants, so the key decides which namespace a request may use: a key
bound to ``team-a`` works in ``team-a`` only (no ``X-Namespace`` header means ``team-a``),
an admin key may name any. The keys file keeps no key itself, only its SHA-256, one key a
line::

    # namespace  hash                         (``*``: an admin key)
    team-a       sha256:9f86d081884c7d65...
    *            sha256:2c26b46b68ffc68f...

``semantic keys add NAMESPACE --file PATH`` makes a key and appends its line; ``semantic
keys hash NAMESPACE`` prints the line for a key read from stdin. A request's key is hashed
and compared with every stored hash in constant time, so neither the file nor the timing
of a refusal tells a key.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from semantic.adapters.http.identity import checked_id
from semantic.domain.errors import InvalidRequestError, SemanticError
from semantic.domain.quotas import TIERS

ADMIN = "*"
KEYS_FILE_ENV = "SEMANTIC_API_KEYS_FILE"
_HASH = re.compile(r"sha256:([0-9a-f]{64})")
_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?")


class KeysFileError(SemanticError):
    """The keys file cannot be read or holds a line that is not a key's."""


@dataclass(frozen=True, slots=True)
class Grant:
    """What a key opens: one namespace, or every one (``namespace`` None)."""

    namespace: str | None


class KeyRing:
    """The keys a server takes; empty: no key is asked for."""

    def __init__(self, entries: Iterable[tuple[bytes, Grant]] = ()) -> None:
        self._entries = tuple(entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def grant_for(self, key: bytes) -> Grant | None:
        """The grant of ``key``, None for no key of ours; every stored hash is compared,
        whichever matches, so the time taken says nothing of which or whether."""
        digest = hashlib.sha256(key).digest()
        found = None
        for stored, grant in self._entries:
            if hmac.compare_digest(digest, stored) and found is None:
                found = grant
        return found


def hash_line(namespace: str, key: str) -> str:
    """The keys file's line for ``key`` bound to ``namespace`` (``*``: admin)."""
    if namespace != ADMIN:
        checked_id(namespace, "namespace")
    return f"{namespace} sha256:{hashlib.sha256(key.encode()).hexdigest()}"


def new_key() -> str:
    """A fresh key: 256 random bits, URL-safe, with a prefix that says whose it is."""
    return "sk-semantic-" + secrets.token_urlsafe(32)


def keyring(admin_key: str | None, keys_file: Path | None) -> KeyRing:
    """``--api-key`` (an admin key) and the keys file's keys together."""
    entries = read_keys_file(keys_file) if keys_file is not None else []
    if admin_key:
        entries.append((hashlib.sha256(admin_key.encode()).digest(), Grant(None)))
    return KeyRing(entries)


def read_keys_file(path: Path) -> list[tuple[bytes, Grant]]:
    entries: dict[bytes, Grant] = {}
    for number, fields in _lines(path):
        digest, grant = _parse(fields, f"{path}, line {number}")
        if entries.get(digest, grant) != grant:
            raise KeysFileError(f"{path}, line {number}: this key is bound to two namespaces")
        entries[digest] = grant
    if not entries:
        raise KeysFileError(f"the API keys file {path} holds no key")
    return list(entries.items())


def _lines(path: Path) -> Iterable[tuple[int, list[str]]]:
    """Each line's fields with its number, comments and blank lines left out."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeError) as error:
        raise KeysFileError(f"cannot read the API keys file {path}: {error}") from None
    for number, line in enumerate(text.splitlines(), 1):
        if fields := line.split("#", 1)[0].split():
            yield number, fields


def _parse(fields: list[str], where: str) -> tuple[bytes, Grant]:
    hashed = _HASH.fullmatch(fields[1].lower()) if len(fields) >= 2 else None
    if hashed is None:
        raise KeysFileError(
            f"{where}: expected `NAMESPACE sha256:HEX` (64 hex digits; `*` for an admin key),"
            " then optionally `memory_mb=N disk_mb=N shared_mb=N`; `semantic keys hash "
            "NAMESPACE` prints such a line for a key read from stdin"
        )
    namespace = fields[0]
    if namespace != ADMIN:
        try:
            checked_id(namespace, "namespace")
        except InvalidRequestError as error:
            raise KeysFileError(f"{where}: {error}") from None
    _limits(fields[2:], namespace, where)  # read whole, so a bad one is named at start
    return bytes.fromhex(hashed.group(1)), Grant(None if namespace == ADMIN else namespace)


def key_quotas(path: Path) -> dict[str, dict[str, float]]:
    """The namespaces' quotas their key lines give (``team-a sha256:... disk_mb=4096``),
    by namespace, in MiB: what ``--namespace-quotas`` takes, so the two are one rule."""
    quotas: dict[str, dict[str, float]] = {}
    for number, fields in _lines(path):
        where = f"{path}, line {number}"
        limits = _limits(fields[2:], fields[0], where)
        if limits and quotas.setdefault(fields[0], limits) != limits:
            raise KeysFileError(f"{where}: namespace {fields[0]!r} is given two quotas")
    return quotas


def _limits(fields: list[str], namespace: str, where: str) -> dict[str, float]:
    limits: dict[str, float] = {}
    for field in fields:
        name, _, value = field.partition("=")
        if name not in TIERS or not _NUMBER.fullmatch(value) or name in limits:
            raise KeysFileError(
                f"{where}: {field!r} is not a quota (`memory_mb=N`, `disk_mb=N` or `shared_mb=N`, "
                "once each)"
            )
        limits[name] = float(value)
    if limits and namespace == ADMIN:
        raise KeysFileError(f"{where}: an admin key (`*`) has no namespace to limit")
    return limits
