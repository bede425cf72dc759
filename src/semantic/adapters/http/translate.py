"""Protocol fields to the generation use case, shared by the OpenAI and Anthropic edges."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from semantic.adapters.http.errors import ModelNotFoundError
from semantic.domain.chat import ChatMessage
from semantic.domain.errors import InvalidRequestError
from semantic.domain.generation import FinishReason, SamplingParams

DEFAULT_MODEL_ALIAS = "default"
MAX_STOP_STRINGS = 16


def check_model(requested: str, served: str) -> None:
    if requested not in (served, DEFAULT_MODEL_ALIAS):
        raise ModelNotFoundError(
            f"model {requested!r} is not served here; use {served!r} or {DEFAULT_MODEL_ALIAS!r}"
        )


OPENAI_MAX_TEMPERATURE = 2.0
ANTHROPIC_MAX_TEMPERATURE = 1.0


def sampling(
    temperature: float | None,
    top_p: float | None,
    seed: int | None,
    top_k: int | None = None,
    *,
    max_temperature: float = OPENAI_MAX_TEMPERATURE,
    penalties: tuple[float | None, float | None] = (None, None),
    bias: Mapping[str, float] | None = None,
) -> SamplingParams:
    """The protocol's own temperature range is kept (OpenAI's 0-2, Anthropic's 0-1), so a
    request that the real API would refuse is refused here too, not sampled near-randomly.
    ``penalties``: OpenAI's presence and frequency penalties; ``bias``: its ``logit_bias``."""
    if temperature is not None and not 0 <= temperature <= max_temperature:
        raise InvalidRequestError(
            f"temperature must be between 0 and {max_temperature:g}, got {temperature}",
            param="temperature",
        )
    presence, frequency = penalties
    return SamplingParams(
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        seed=seed,
        top_k=0 if top_k is None or top_k == -1 else top_k,  # -1: all tokens, as in vLLM
        presence_penalty=presence or 0.0,
        frequency_penalty=frequency or 0.0,
        logit_bias=_token_biases(bias),
    )


def _token_biases(bias: Mapping[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias``, keyed by token ids written in decimal digits, each id once
    (``"5"`` and ``"05"`` would otherwise add up past the range); a zero bias is none."""
    pairs: dict[int, float] = {}
    for key, value in (bias or {}).items():
        token = int(key) if key.isascii() and key.isdigit() else None
        if token is None or token in pairs:
            why = "a token id" if token is None else "named twice"
            raise InvalidRequestError(
                f"logit_bias keys are token ids, each once: {key!r} is {why}", param="logit_bias"
            )
        pairs[token] = float(value)
    return tuple(sorted((t, v) for t, v in pairs.items() if v))


def stop_strings(stop: str | Sequence[str] | None, field: str = "stop") -> tuple[str, ...]:
    """``field`` names the request's own field in a refusal (Anthropic's ``stop_sequences``)."""
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if len(stops) > MAX_STOP_STRINGS:
        raise InvalidRequestError(f"at most {MAX_STOP_STRINGS} {field} strings", param=field)
    if any(not s for s in stops):
        raise InvalidRequestError(f"{field} strings must not be empty", param=field)
    return stops


def chat(role: str, content: str) -> ChatMessage:
    if role == "developer":
        role = "system"
    return ChatMessage(role, content)


_READ_FIELDS = {"text": "text", "refusal": "refusal"}
"""The kinds of content part read, and which field holds each one's text."""
_NEUTRAL_FIELDS = frozenset({"type", "cache_control", "citations"})
_CACHE_CONTROL_TYPES = frozenset({"ephemeral"})


def joined_text(
    content: str | Sequence[msgspec.Struct] | None, what: str, *, refusal_ok: bool = False
) -> str:
    """A message's content as one string: plain text, or the text of its text parts. A
    ``refusal`` part is an assistant's reply sent back (``refusal_ok``); nobody else
    writes one."""
    if content is None or isinstance(content, str):
        return content or ""
    if not content:
        raise InvalidRequestError(
            f"a message's list of {what}s must not be empty", param="messages"
        )
    parts = []
    for part in content:
        kind = getattr(part, "type", None)
        field = _READ_FIELDS.get(kind) if isinstance(kind, str) else None
        if field == "refusal" and not refusal_ok:
            raise InvalidRequestError(
                f"only an assistant's {what}s can be refusals", param="messages"
            )
        if field is None or not hasattr(part, field):
            raise InvalidRequestError(f"{what} type {kind!r} is not supported", param="messages")
        for name in part.__struct_fields__:
            if name not in _NEUTRAL_FIELDS and name != field and getattr(part, name) is not None:
                message = f"a {what} of type {kind!r} has no field {name!r}"
                raise InvalidRequestError(message, param="messages")
        _check_cache_control(getattr(part, "cache_control", None), what)
        text = getattr(part, field)
        if not isinstance(text, str):
            raise InvalidRequestError(
                f"a {what} of type {kind!r} needs its {field!r}", param="messages"
            )
        parts.append(text)
    return "".join(parts)


def _check_cache_control(cache_control: dict[str, Any] | None, what: str) -> None:
    """Accepted as Anthropic defines it, though it changes nothing here (every prefix is
    cached): a typo in it is still the client's to hear about."""
    if cache_control is None:
        return
    kind = cache_control.get("type")
    if kind not in _CACHE_CONTROL_TYPES:
        message = f"a {what}'s cache_control type {kind!r} is not supported; only 'ephemeral'"
        raise InvalidRequestError(message, param="messages")


def must_default(value: object, default: object, name: str) -> None:
    """A field we accept only at its default: anything else is refused, never ignored."""
    if value is not None and value != default:
        raise InvalidRequestError(f"{name}={value!r} is not supported", param=name)


OPENAI_FINISH = {
    FinishReason.END_OF_TURN: "stop",
    FinishReason.STOP_STRING: "stop",
    FinishReason.LOW_CONFIDENCE: "stop",
    FinishReason.CANCELLED: "stop",
    FinishReason.MAX_TOKENS: "length",
    FinishReason.MAX_CHARS: "length",
    FinishReason.POOL_EXHAUSTED: "length",
}

ANTHROPIC_STOP = {
    FinishReason.END_OF_TURN: "end_turn",
    FinishReason.STOP_STRING: "stop_sequence",
    FinishReason.LOW_CONFIDENCE: "end_turn",
    FinishReason.CANCELLED: "end_turn",
    FinishReason.MAX_TOKENS: "max_tokens",
    FinishReason.MAX_CHARS: "max_tokens",
    FinishReason.POOL_EXHAUSTED: "max_tokens",
}
