"""Tokens' log-probabilities in OpenAI's shapes: chat's ``logprobs.content`` entries (the
Responses API's ``output_text.logprobs`` are the same entries) and the legacy completions'
parallel lists; and what a request asks for.

A token's text is the tokenizer's decoding of it alone: a token that holds part of a
character (byte-level vocabularies split some) shows as U+FFFD, while its ``bytes`` are
the part's own (``TokenPiece``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from semantic.domain.errors import InvalidRequestError
from semantic.domain.generation import (
    MAX_TOP_LOGPROBS,
    TokenLogprob,
    TokenPiece,
    check_logprobs,
)

TokenPieces = Callable[[int], TokenPiece]

RESPONSES_INCLUDE = "message.output_text.logprobs"
"""What a Responses request puts in ``include`` for its text's log-probabilities."""


def pieces_for(asked: int | None, token_piece: TokenPieces) -> TokenPieces | None:
    """Each token as its entries show it, where the request ``asked`` for log-probabilities
    (None: it did not), a request's recent tokens remembered (a reply repeats many)."""
    return None if asked is None else functools.lru_cache(maxsize=4096)(token_piece)


def chat_logprobs_asked(logprobs: bool | None, top_logprobs: int | None) -> int | None:
    """Chat's ``logprobs`` flag and ``top_logprobs`` count as the alternatives wanted per
    token (None: no log-probabilities)."""
    if not logprobs:
        if top_logprobs:
            raise InvalidRequestError("top_logprobs needs logprobs=true", param="top_logprobs")
        return None
    check_logprobs(top_logprobs or 0)
    return top_logprobs or 0


def completion_logprobs_asked(logprobs: int | None) -> int | None:
    """The legacy completions' ``logprobs`` (alternatives per token; None: none)."""
    if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidRequestError(
            f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {logprobs}",
            param="logprobs",
        )
    return logprobs


def responses_logprobs_asked(include: Sequence[str] | None, top_logprobs: int | None) -> int | None:
    """The Responses API asks with ``include`` (or, leniently, a ``top_logprobs`` count
    above 0 alone): the alternatives wanted per token, None for none."""
    check_logprobs(top_logprobs)
    if RESPONSES_INCLUDE in (include or ()) or top_logprobs:
        return top_logprobs or 0
    return None


def chat_content(entries: Sequence[TokenLogprob], pieces: TokenPieces) -> dict[str, Any]:
    """A message's (or a streamed delta's) ``logprobs`` object."""
    return {"content": token_entries(entries, pieces), "refusal": None}


def token_entries(entries: Sequence[TokenLogprob], pieces: TokenPieces) -> list[dict[str, Any]]:
    """Each token's entry: its text, log-probability and bytes, and its alternatives'."""
    return [_entry(entry, pieces) for entry in entries]


def _entry(entry: TokenLogprob, pieces: TokenPieces) -> dict[str, Any]:
    return {
        **_token(entry.token, entry.logprob, pieces),
        "top_logprobs": [_token(token, logprob, pieces) for token, logprob in entry.top],
    }


def _token(token: int, logprob: float, pieces: TokenPieces) -> dict[str, Any]:
    piece = pieces(token)
    return {"token": piece.text, "logprob": logprob, "bytes": list(piece.raw)}


def completion_lists(
    entries: Sequence[TokenLogprob], pieces: TokenPieces, offset: int = 0
) -> dict[str, Any]:
    """The legacy completions' ``logprobs``: tokens, theirs, the alternatives by text, and
    where each token's text starts in the reply (from ``offset``)."""
    tokens = [pieces(entry.token).text for entry in entries]
    starts, at = [], offset
    for shown in tokens:
        starts.append(at)
        at += len(shown)
    return {
        "tokens": tokens,
        "token_logprobs": [entry.logprob for entry in entries],
        "top_logprobs": [{pieces(t).text: lp for t, lp in entry.top} for entry in entries],
        "text_offset": starts,
    }
