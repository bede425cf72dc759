"""Tokens' log-probabilities in OpenAI's shapes: chat's ``logprobs.content`` entries and
the legacy completions' parallel lists; and what a request asks for.

A token's text is the tokenizer's decoding of it alone: a token that holds part of a
character (byte-level vocabularies split some) shows as U+FFFD, and its ``bytes`` are
those of that text, not the token's raw bytes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from semantic.domain.errors import InvalidRequestError
from semantic.domain.generation import MAX_TOP_LOGPROBS, TokenLogprob, check_logprobs

TokenText = Callable[[int], str]


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


def chat_content(entries: Sequence[TokenLogprob], text: TokenText) -> dict[str, Any]:
    """A message's (or a streamed delta's) ``logprobs`` object."""
    return {"content": [_chat_entry(entry, text) for entry in entries], "refusal": None}


def _chat_entry(entry: TokenLogprob, text: TokenText) -> dict[str, Any]:
    return {
        **_token(entry.token, entry.logprob, text),
        "top_logprobs": [_token(token, logprob, text) for token, logprob in entry.top],
    }


def _token(token: int, logprob: float, text: TokenText) -> dict[str, Any]:
    shown = text(token)
    return {"token": shown, "logprob": logprob, "bytes": list(shown.encode())}


def completion_lists(
    entries: Sequence[TokenLogprob], text: TokenText, offset: int = 0
) -> dict[str, Any]:
    """The legacy completions' ``logprobs``: tokens, theirs, the alternatives by text, and
    where each token's text starts in the reply (from ``offset``)."""
    tokens = [text(entry.token) for entry in entries]
    starts, at = [], offset
    for shown in tokens:
        starts.append(at)
        at += len(shown)
    return {
        "tokens": tokens,
        "token_logprobs": [entry.logprob for entry in entries],
        "top_logprobs": [{text(t): lp for t, lp in entry.top} for entry in entries],
        "text_offset": starts,
    }
