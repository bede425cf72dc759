"""Content addresses for KV blocks.

A block's KV depends on every token before it, so its id hashes the previous block's id and
this block's tokens. The chain starts from a root that hashes the model fingerprint and the
namespace: two agents of one namespace that share a prefix compute the same ids for it, while
no two models, and no two namespaces, ever do (a shared cache must not become a side channel
between tenants). ADR 0005 has the details.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Sequence

_PERSON = b"semantic-kv-v1"


def chain_root(fingerprint: str, namespace: str) -> str:
    """The parent id of a sequence's first block."""
    digest = hashlib.blake2b(digest_size=32, person=_PERSON)
    digest.update(b"root\0" + fingerprint.encode() + b"\0" + namespace.encode())
    return digest.hexdigest()


def block_key(parent_key: str, tokens: Sequence[int]) -> str:
    """The id of the block holding ``tokens`` after the block ``parent_key``.

    BLAKE2b-256 over the parent id, the token count and the tokens as little-endian uint32.
    A partial block (fewer than 256 tokens) gets its own id, different from the full block
    it will grow into.
    """
    digest = hashlib.blake2b(digest_size=32, person=_PERSON)
    digest.update(bytes.fromhex(parent_key))
    packed = array("I", tokens)
    if sys.byteorder != "little":  # pragma: no cover - ids must not depend on the CPU
        packed.byteswap()
    digest.update(len(tokens).to_bytes(4, "little"))
    digest.update(packed.tobytes())
    return digest.hexdigest()


def chain_keys(
    root: str, tokens: Sequence[int], block_tokens: int, *, include_partial: bool = False
) -> list[str]:
    """Ids of the consecutive blocks of ``tokens``; the partial tail only if asked."""
    keys: list[str] = []
    parent = root
    end = len(tokens) if include_partial else len(tokens) - len(tokens) % block_tokens
    for start in range(0, end, block_tokens):
        parent = block_key(parent, tokens[start : min(start + block_tokens, end)])
        keys.append(parent)
    return keys
