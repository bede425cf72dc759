"""Value objects of one generation: how to sample, when to stop, why it stopped."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum, StrEnum

from semantic.domain.errors import InvalidRequestError


class FinishReason(StrEnum):
    """Why a request ended. The API edge maps these to each protocol's own words."""

    END_OF_TURN = "end_of_turn"
    STOP_STRING = "stop_string"
    MAX_TOKENS = "max_tokens"
    MAX_CHARS = "max_chars"
    LOW_CONFIDENCE = "low_confidence"
    CANCELLED = "cancelled"
    POOL_EXHAUSTED = "pool_exhausted"
    ERROR = "error"


LIMITS = frozenset({FinishReason.MAX_TOKENS, FinishReason.MAX_CHARS, FinishReason.POOL_EXHAUSTED})
"""Reasons a reply was cut short by a limit rather than ended (OpenAI's ``length``)."""


class Priority(IntEnum):
    """Queue priority; a lower value is served first."""

    HIGH = 0
    NORMAL = 1
    LOW = 2

    @classmethod
    def parse(cls, text: str) -> Priority:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise InvalidRequestError(
                f"priority must be one of high, normal, low; got {text[:16]!r}"
                + (f" ({len(text)} characters)" if len(text) > 16 else ""),
                param="priority",
            ) from None


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Greedy when ``temperature`` is 0; ``seed`` makes a sampled answer repeatable."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    top_k: int = 0
    """Sample among this many most likely tokens only; 0 keeps them all."""
    presence_penalty: float = 0.0
    """Taken off the score of every token already drawn in this reply (OpenAI's, -2 to 2)."""
    frequency_penalty: float = 0.0
    """Taken off a drawn token's score once for each time it was drawn (-2 to 2)."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, added to its score) pairs, -100 to 100 (100 all but forces a token)."""

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature) or not 0.0 <= self.temperature <= 10.0:
            raise InvalidRequestError(
                f"temperature must be between 0 and 10, got {self.temperature}",
                param="temperature",
            )
        if not math.isfinite(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}", param="top_p")
        if not 0 <= self.top_k < 2**31:
            raise InvalidRequestError(f"top_k must be 0 or more, got {self.top_k}", param="top_k")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise InvalidRequestError(f"seed must be in [0, 2^63), got {self.seed}", param="seed")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not math.isfinite(value) or not -2.0 <= value <= 2.0:
                message = f"{name} must be between -2 and 2, got {value}"
                raise InvalidRequestError(message, param=name)
        for token, bias in self.logit_bias:
            if not 0 <= token < 2**31 or not math.isfinite(bias) or not -100.0 <= bias <= 100.0:
                raise InvalidRequestError(
                    f"logit_bias takes token ids and biases from -100 to 100, got {token}: {bias}",
                    param="logit_bias",
                )

    @property
    def penalized(self) -> bool:
        """Whether its scores depend on the tokens it drew: such a reply draws every token
        (no forced runs), so that each one is counted."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = SamplingParams()


MAX_TOP_LOGPROBS = 20
"""Alternatives a token's log-probability may come with (OpenAI's ``top_logprobs`` bound)."""


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A generated token's log-probability under the distribution it was drawn from (the
    model's, within its grammar where one constrains it; before temperature), and the
    ``top`` most likely tokens there with theirs, most likely first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class TokenPiece:
    """One token as a log-probability's entry shows it: ``text``, its decoding alone (U+FFFD
    where it holds part of a character), and ``raw``, the bytes of text it stands for (the
    part's bytes there, which a client joins with its neighbours' to rebuild the character)."""

    text: str
    raw: bytes


def check_logprobs(top: int | None) -> None:
    """``top``: alternatives per token wanted (0: the token's own only; None: none)."""
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise InvalidRequestError(
            f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {top}",
            param="top_logprobs",
        )


@dataclass(frozen=True, slots=True)
class CompletionCriteria:
    """When a request ends besides the model's own end-of-turn tokens.

    Checked in this order every token: cancellation, ``max_tokens``, end-of-turn tokens,
    ``stop_strings``, ``max_chars``, then low confidence (only when ``min_top_prob`` is set:
    the top token's probability stayed below it for ``low_confidence_patience`` tokens).
    """

    max_tokens: int
    stop_strings: tuple[str, ...] = ()
    stops_before: tuple[str, ...] = ()
    """Where stop strings are no longer looked for: the first of these the reply writes
    (the text that starts a tool call). A client's stop strings end its text, not a call's
    JSON, which they would cut into arguments that do not parse."""
    max_chars: int | None = None
    min_top_prob: float | None = None
    low_confidence_patience: int = 8

    def __post_init__(self) -> None:
        if self.max_tokens <= 0:
            raise InvalidRequestError(
                f"max_tokens must be at least 1, got {self.max_tokens}", param="max_tokens"
            )
        if any(not s for s in self.stop_strings):
            raise InvalidRequestError("stop strings must not be empty", param="stop")
        if any(not s for s in self.stops_before):
            raise InvalidRequestError("the text that ends stop strings' reach must not be empty")
        if self.max_chars is not None and self.max_chars <= 0:
            raise InvalidRequestError("max_chars must be positive", param="max_chars")
        if self.min_top_prob is not None and not 0.0 < self.min_top_prob < 1.0:
            raise InvalidRequestError("min_top_prob must be in (0, 1)", param="min_top_prob")
        if self.low_confidence_patience <= 0:
            raise InvalidRequestError("low_confidence_patience must be positive")

    @property
    def longest_stop(self) -> int:
        return max((len(s) for s in self.stop_strings), default=0)

    @property
    def longest_marker(self) -> int:
        return max((len(s) for s in self.stops_before), default=0)


@dataclass(frozen=True, slots=True)
class RequestStats:
    """Per-request timings (seconds) and token counts, for ``usage`` and metrics."""

    queued_s: float
    prefill_s: float
    decode_s: float
    cached_tokens: int
    computed_tokens: int
    generated_tokens: int
    dropped_tokens: int = 0
    """Prompt tokens found in the cache that could not be restored, so were computed."""

    @property
    def time_to_first_token_s(self) -> float:
        return self.queued_s + self.prefill_s


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """A request at its end, as observers hear of it: whose it was, what it cost, and when
    its first token came (None: it made none)."""

    namespace: str
    agent_id: str
    prompt_tokens: int
    stats: RequestStats
    seconds: float
    """Accepted to ended."""
    first_token_s: float | None
    ended_at: float
    """Wall-clock time (``time.time()``) of its end."""
