"""The checks a request passes before any work, in one place: each refusal names its field.

Every front door reaches the engine through ``GenerationService``, which runs these once,
before the stored prefix is restored; the engine's intake trusts what it is handed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from semantic.domain.errors import InvalidRequestError, PromptTooLongError
from semantic.domain.generation import SamplingParams


@dataclass(frozen=True, slots=True)
class Limits:
    """What this server can run: the model's window, the reply bounds, the vocabulary and
    the tokens the KV budget holds (``None`` where a caller does not bound them)."""

    max_context: int
    max_tokens_cap: int
    default_max_tokens: int
    vocab_size: int | None = None
    kv_tokens: int | None = None


def checked_max_tokens(prompt: Sequence[int], max_tokens: int | None, limits: Limits) -> int:
    """Refuse a request this server cannot run; returns the max_tokens it will run with (an
    unset one shrinks to the room the prompt leaves, a set one that overflows is refused)."""
    wanted = limits.default_max_tokens if max_tokens is None else max_tokens
    if not 0 < wanted <= limits.max_tokens_cap:
        raise InvalidRequestError(
            f"max_tokens must be between 1 and {limits.max_tokens_cap} (this server's cap, "
            f"its --max-tokens-cap), got {wanted}",
            param="max_tokens",
        )
    _check_prompt(prompt, limits)
    if len(prompt) + wanted <= limits.max_context:
        return wanted
    if max_tokens is not None:
        raise PromptTooLongError(
            f"the prompt ({len(prompt)} tokens) plus max_tokens ({max_tokens}) exceeds the "
            f"model's context of {limits.max_context}",
            param="max_tokens",
        )
    return limits.max_context - len(prompt)


def _check_prompt(prompt: Sequence[int], limits: Limits) -> None:
    if not prompt:
        raise InvalidRequestError("the prompt is empty", param="messages")
    _check_in_vocabulary(prompt, limits, "token id {} is", "messages")
    if len(prompt) >= limits.max_context:
        raise PromptTooLongError(
            f"the prompt is {len(prompt)} tokens; the model's context is {limits.max_context}",
            param="messages",
        )
    if limits.kv_tokens is not None and len(prompt) + 1 > limits.kv_tokens:
        raise PromptTooLongError(
            f"the prompt needs {len(prompt) + 1} tokens of KV; this server's KV budget holds "
            f"{limits.kv_tokens} (raise --kv-budget-mb or shorten the prompt)",
            param="messages",
        )


def check_logit_bias(sampling: SamplingParams, limits: Limits) -> None:
    """A bias must name a token of the vocabulary (the model's scores have no other)."""
    tokens = [token for token, _ in sampling.logit_bias]
    _check_in_vocabulary(tokens, limits, "logit_bias names token {},", "logit_bias")


def _check_in_vocabulary(tokens: Sequence[int], limits: Limits, says: str, param: str) -> None:
    """``says``: the refusal's start, ``{}`` the first id outside."""
    vocab = limits.vocab_size
    bad = None if vocab is None else next((t for t in tokens if not 0 <= t < vocab), None)
    if bad is not None and vocab is not None:
        message = f"{says.format(bad)} outside the vocabulary (0 to {vocab - 1})"
        raise InvalidRequestError(message, param=param)
