"""Protocol fields to the generation use case, shared by the OpenAI and Anthropic edges."""

from __future__ import annotations

from collections.abc import Sequence

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


def sampling(
    temperature: float | None, top_p: float | None, seed: int | None, top_k: int | None = None
) -> SamplingParams:
    return SamplingParams(
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        seed=seed,
        top_k=0 if top_k is None or top_k == -1 else top_k,  # -1: all tokens, as in vLLM
    )


def stop_strings(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if len(stops) > MAX_STOP_STRINGS:
        raise InvalidRequestError(f"at most {MAX_STOP_STRINGS} stop strings", param="stop")
    if any(not s for s in stops):
        raise InvalidRequestError("stop strings must not be empty", param="stop")
    return stops


def chat(role: str, content: str) -> ChatMessage:
    if role == "developer":
        role = "system"
    return ChatMessage(role, content)


def joined_text(content: str | Sequence[object] | None, what: str) -> str:
    """A message's content as one string: plain text, or the text of its text parts."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        kind, text = getattr(part, "type", None), getattr(part, "text", None)
        if kind != "text":
            raise InvalidRequestError(f"{what} type {kind!r} is not supported", param="messages")
        parts.append(text or "")
    return "".join(parts)


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
