"""A turn's prompt, marked so a chain's next turn can find it again in the stored blocks.

After a restart the tokenizer remembers nothing (ADR 0014), and a chain's next turn would
tokenize its whole history again. Its previous prompt's ids are in the previous agent's
blocks, after which the reply's follow (ids the model chose, not necessarily the ones the
tokenizer gives their text). The mark says how many of the blocks' leading ids are the
prompt and a digest of them with the model fingerprint: ids that are not exactly that
prompt, or of another model, are never taken for it.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Mapping, Sequence

from semantic.ports.metadata_store import AgentRecord, BlockRecord


def mark(fingerprint: str, prompt: Sequence[int]) -> str:
    """``<count>:<digest>`` of ``prompt`` as rendered for the model of ``fingerprint``."""
    return f"{len(prompt)}:{_digest(fingerprint, prompt)}"


def marked(fingerprint: str, prompt_mark: str, tokens: Sequence[int]) -> Sequence[int]:
    """The leading ids of ``tokens`` that ``prompt_mark`` marks, or none if they differ."""
    count, _, digest = prompt_mark.partition(":")
    if not count.isdigit() or int(count) > len(tokens):
        return ()
    prompt = tokens[: int(count)]
    return prompt if _digest(fingerprint, prompt) == digest else ()


def leading_tokens(agent: AgentRecord, records: Mapping[str, BlockRecord]) -> list[int]:
    """The ids an agent's blocks hold, in order, up to the first whose record is gone."""
    tokens: list[int] = []
    for key in agent.block_keys:
        if (record := records.get(key)) is None:
            break
        tokens.extend(record.tokens)
    return tokens


def _digest(fingerprint: str, prompt: Sequence[int]) -> str:
    digest = hashlib.blake2b(fingerprint.encode() + b"\0", digest_size=16)
    digest.update(array("I", prompt).tobytes())
    return digest.hexdigest()
