"""How much prompt to prefill in a round: the fairness knob between long prompts and streams.

A prefill chunk and a decode step share the machine, so every prompt token prefilled in a
round delays every stream's next token. With nothing decoding, rounds take big chunks (fast
prompts). While streams decode, each round gets a time budget, ``gap_ratio`` times the
measured decode step, and chunks are sized from a cost model learned online: a token at
context position p costs about ``a + b * p`` seconds (weights, then attention over the
history). A fixed token budget is also available, to compare (see ADR 0009 for the curve).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from semantic.domain.errors import InvalidRequestError


@dataclass(frozen=True, slots=True)
class PacerConfig:
    idle_tokens: int = 1024
    gap_ratio: float = 2.0
    min_tokens: int = 16
    fixed_tokens: int | None = None
    """Set to use a fixed token budget per round instead of the time budget."""

    def __post_init__(self) -> None:
        if self.idle_tokens <= 0 or self.min_tokens <= 0 or self.gap_ratio <= 0:
            raise InvalidRequestError("pacer settings must be positive")
        if self.fixed_tokens is not None and self.fixed_tokens <= 0:
            raise InvalidRequestError("a fixed prefill budget must be positive")


@dataclass(frozen=True, slots=True)
class RoundBudget:
    tokens: int
    seconds: float | None
    """None: only the token budget applies."""


class PrefillPacer:
    def __init__(self, config: PacerConfig | None = None) -> None:
        self.config = config or PacerConfig()
        self._decode_s = 0.1
        self._decode_seen = False
        # Least squares on t = a*n + b*n*(p + n/2), with exponential forgetting.
        self._sums = [1.0, 0.0, 1e6, 3e-3, 1e6 * 1.2e-6]  # xx, xy, yy, xt, yt: a prior
        self._decay = 0.9

    def observe_decode(self, seconds: float) -> None:
        if not self._decode_seen:
            self._decode_s, self._decode_seen = seconds, True
        self._decode_s = 0.8 * self._decode_s + 0.2 * seconds

    def observe_prefill(self, tokens: int, position: int, seconds: float) -> None:
        x, y = float(tokens), tokens * (position + tokens / 2)
        d = self._decay
        s = self._sums
        self._sums = [
            d * s[0] + x * x,
            d * s[1] + x * y,
            d * s[2] + y * y,
            d * s[3] + x * seconds,
            d * s[4] + y * seconds,
        ]

    def round_budget(self, decoding: int) -> RoundBudget:
        if self.config.fixed_tokens is not None:
            return RoundBudget(self.config.fixed_tokens, None)
        if decoding == 0:
            return RoundBudget(self.config.idle_tokens, None)
        return RoundBudget(self.config.idle_tokens, self.config.gap_ratio * self._decode_s)

    def tokens_within(self, seconds: float, position: int) -> int:
        """Largest chunk at ``position`` predicted to take at most ``seconds``."""
        a, b = self.coefficients()
        base = a + b * position
        if b <= 0:
            n = seconds / max(base, 1e-6)
        else:  # b/2 n^2 + base n - seconds = 0
            n = (-base + math.sqrt(base * base + 2 * b * seconds)) / b
        return max(0, int(n))

    def coefficients(self) -> tuple[float, float]:
        xx, xy, yy, xt, yt = self._sums
        det = xx * yy - xy * xy
        if abs(det) < 1e-12:
            return max(xt / xx, 1e-5), 0.0
        a = (xt * yy - yt * xy) / det
        b = (yt * xx - xt * xy) / det
        return max(a, 1e-5), max(b, 0.0)
