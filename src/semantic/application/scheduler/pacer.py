"""How much prompt to prefill in a round: the fairness knob between long prompts and streams.

A prefill chunk and a decode step share the machine, so every prompt token prefilled in a
round delays every stream's next token. With nothing decoding, rounds take big chunks (fast
prompts). While streams decode, each round takes ``busy_tokens`` (64 by default, chosen from
the measured curve in ADR 0009) for each request waiting for its first token, or, if that
is None, a time budget of ``gap_ratio`` decode steps, with chunks sized from a cost model
learned online: a pass over n tokens at context position p costs about
``c + n * (a + b * p)`` seconds (weights, then attention).

When exactly one prompt waits beside the streams and the backend can compute a chunk inside
the decode step's own forward pass, the chunk *rides* the step: it adds only its marginal
cost (no second weight stream), sized by time (``ride_ratio`` decode steps) with its own
cost model, so late chunks at long contexts shrink and every round stays close to a plain
decode step. A longer lone prompt is sliced between layers instead, each round held to
``1 + slice_ratio`` of the streams' steps as they were before it came (``anchor``): what a
stream's reader sees is its pace slowed by that factor, however its own steps grow
meanwhile. ADR 0009 has the measured curve.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from semantic.domain.errors import InvalidRequestError
from semantic.ports.model_backend import SoFar

DECODE_WINDOW = 15
"""Decode steps the typical step's time is taken over (odd: the median is one of them)."""


@dataclass(frozen=True, slots=True)
class PacerConfig:
    idle_tokens: int = 1024
    """Prompt tokens per round while nothing decodes: big chunks, fast prompts."""
    busy_tokens: int | None = 64
    """Prompt tokens per round while requests decode; None paces by time instead."""
    gap_ratio: float = 2.0
    """With ``busy_tokens`` None: prefill time per round, in decode steps."""
    min_tokens: int = 16
    ride_ratio: float | None = None
    """Seconds a ridden chunk may add to a round, in decode steps; None never rides."""
    ride_min_tokens: int = 4
    slice_ratio: float | None = None
    """Seconds of a lone prompt's layers per round, in decode steps; None never slices.
    Where both are on, a chunk predicted to ride within ``ride_ratio`` rides instead."""
    slice_tokens: int = 256
    """The chunk a sliced prompt computes layer by layer."""
    idle_slice_seconds: float | None = None
    """With nothing decoding, the round of a prompt with more than a chunk still to go, in
    seconds of sliced layers (None: one ``idle_tokens`` pass): the engine looks at the
    queue between rounds, so a request arriving during a long prefill waits at most this
    long to be admitted (``PrefillAdder.plan``)."""
    fixed_tokens: int | None = None
    """One budget for every round, busy or idle (tests and comparisons)."""

    def __post_init__(self) -> None:
        if self.idle_tokens <= 0 or self.min_tokens <= 0 or self.gap_ratio <= 0:
            raise InvalidRequestError("pacer settings must be positive")
        if (self.ride_ratio is not None and self.ride_ratio <= 0) or self.ride_min_tokens <= 0:
            raise InvalidRequestError("pacer settings must be positive")
        if self.idle_slice_seconds is not None and self.idle_slice_seconds <= 0:
            raise InvalidRequestError("pacer settings must be positive")
        if (self.slice_ratio is not None and self.slice_ratio <= 0) or self.slice_tokens <= 0:
            raise InvalidRequestError("pacer settings must be positive")
        for budget in (self.fixed_tokens, self.busy_tokens):
            if budget is not None and budget <= 0:
                raise InvalidRequestError("a prefill budget must be positive")


@dataclass(frozen=True, slots=True)
class RoundBudget:
    tokens: int
    seconds: float | None
    """None: only the token budget applies."""
    ride: bool = False
    """One chunk, computed inside the decode step's forward pass."""
    sliced: bool = False
    """One chunk, computed layer by layer for ``seconds`` a round (``prefill_slice``)."""


class PrefillPacer:
    def __init__(self, config: PacerConfig | None = None) -> None:
        self.config = config or PacerConfig()
        self._decode_s = 0.1
        self._recent_decodes: deque[float] = deque(maxlen=DECODE_WINDOW)
        self._plain: deque[float] = deque(maxlen=DECODE_WINDOW)
        self._plain_batch = 0
        self._fit = _LeastSquares(prior=(0.07, 2e-3, 1.4e-6))
        self._ride_fit = _LeastSquares(prior=(0.005, 2e-3, 0.4e-6))

    @property
    def decode_seconds(self) -> float:
        """A decode step's recent typical duration, with or without a prompt beside it
        (not ridden): the median of the last ``DECODE_WINDOW``. A moving average let one
        slow step (76 ms among 27 ms ones) raise the next slices' time by a third, and with
        it the streams' worst gaps."""
        return self._decode_s

    def observe_decode(self, seconds: float, *, batch: int = 0, plain: bool = True) -> None:
        """``plain``: no prompt was prefilled in the step's round. Plain steps of the batch
        decoding now are the streams' own pace, which a sliced prompt's rounds are held to
        (``anchor``); any step of another batch size forgets them."""
        self._recent_decodes.append(seconds)
        self._decode_s = statistics.median(self._recent_decodes)
        if batch != self._plain_batch:
            self._plain.clear()
            self._plain_batch = batch
        if plain:
            self._plain.append(seconds)

    def observe_idle(self) -> None:
        """Nothing decodes: streams that come next have a pace of their own to show, even
        as many as the last ones."""
        self._plain.clear()
        self._plain_batch = 0

    def anchor(self, batch: int) -> float:
        """The streams' step before a prompt came beside them: the median of the last plain
        steps of this batch, else the recent typical step. Rounds were once held to the
        recent steps, and those grow while a prompt prefills (each stream's context grows
        by a token a round, and its KV is read every step): the late rounds of a
        4,000-token prompt were 15-20% longer than the same ratio of the steps before it
        came, and the streams' worst gaps with them (ADR 0009)."""
        if self._plain and batch == self._plain_batch:
            return statistics.median(self._plain)
        return self._decode_s

    def slice_seconds(self, batch: int = 0) -> float | None:
        """A slice's time while ``batch`` streams decode; None when slicing is off."""
        ratio = self.config.slice_ratio
        return None if ratio is None else ratio * self.anchor(batch)

    def slice_in_round(self, seconds: float, elapsed: float, batch: int) -> float:
        """What is left of a round for its slice once ``elapsed`` of it has gone (the decode
        step, planning): a round is held to ``anchor + seconds``, so a slow step takes its
        overrun out of the slice and a quick one gives the slice what it left. Should the
        streams' typical step outgrow the anchor by more than half a slice (a prompt long
        enough to see their contexts grow by thousands), the round grows with it: the
        prompt keeps at least half its share."""
        anchor = max(self.anchor(batch), self._decode_s - seconds / 2)
        return max(0.0, anchor + seconds - elapsed)

    def observe_prefill(
        self, tokens: int, position: int, seconds: float, *, ride: bool = False
    ) -> None:
        """``ride``: ``seconds`` is what riding a decode step added to it."""
        fit = self._ride_fit if ride else self._fit
        fit.add((1.0, float(tokens), tokens * (position + tokens / 2)), seconds)

    def observe_ride(self, tokens: int, position: int, step_seconds: float) -> None:
        """A decode step that carried ``tokens`` prompt tokens took ``step_seconds``: what
        they added is its time past the typical step's."""
        self.observe_prefill(tokens, position, step_seconds - self._decode_s, ride=True)

    def chunk_seconds(
        self,
        planned: float | None,
        *,
        in_flight: bool,
        batch: int,
        round_elapsed: Callable[[], float] | None,
    ) -> float | None:
        """How long a chunk's slice may take this round (None: not sliced, run whole).
        ``planned``: the round's slice time, if it was planned sliced. A chunk part way
        through (``in_flight``) goes on at a slice's pace while ``batch`` streams decode,
        else at once. ``round_elapsed``: the round's time so far, once its decode step
        ran (None if it has not): the slice has what is left of the round."""
        seconds = planned
        if in_flight and seconds is None:
            seconds = (self.slice_seconds(batch) if batch else None) or math.inf
        if seconds is not None and round_elapsed is not None and math.isfinite(seconds):
            seconds = self.slice_in_round(seconds, round_elapsed(), batch)
        return seconds

    def slice_budget(
        self, planned: float | None, *, in_flight: bool, batch: int
    ) -> Callable[[SoFar], float]:
        """A sliced chunk's time this round, for the backend to ask as the slice begins:
        ``chunk_seconds`` with the round so far, from the pacer as it will be once it has
        seen the round's step of ``batch`` streams (observed after the round)."""

        def budget(so_far: SoFar) -> float:
            pacer = self
            if so_far.step_seconds is not None:
                pacer = self._after_step(so_far.step_seconds, batch)
            elapsed = so_far.elapsed
            seconds = pacer.chunk_seconds(
                planned,
                in_flight=in_flight,
                batch=so_far.decoding,
                round_elapsed=None if elapsed is None else (lambda: elapsed),
            )
            return math.inf if seconds is None else seconds

        return budget

    def _after_step(self, seconds: float, batch: int) -> PrefillPacer:
        """A copy that has seen a decode step (not plain: a slice is beside it)."""
        twin = copy.copy(self)
        twin.observe_decode(seconds, batch=batch, plain=False)
        return twin

    def __copy__(self) -> PrefillPacer:
        """Its own step windows (a deep copy cost 0.2 ms a sliced round); the fits shared."""
        twin = PrefillPacer.__new__(PrefillPacer)
        windows = {k: deque(v, DECODE_WINDOW) for k, v in vars(self).items() if type(v) is deque}
        vars(twin).update(vars(self), **windows)
        return twin

    def ride_fits(self, tokens: int, position: int) -> bool:
        """Whether riding ``tokens`` is predicted to add at most ``ride_ratio`` steps."""
        ratio = self.config.ride_ratio
        return (
            ratio is not None and self.cost(tokens, position, ride=True) <= ratio * self._decode_s
        )

    def round_budget(
        self, decoding: int, waiting: int = 0, ride_capacity: int = 0, *, can_slice: bool = False
    ) -> RoundBudget:
        """``waiting``: requests still without their first token. While streams decode,
        each of them gets ``busy_tokens`` of the round, as each stream gets its one token:
        one long prompt beside four streams advances 64 tokens a round, and a burst of
        newcomers (31 agents arriving beside one stream) is admitted in a round or two
        instead of 64 tokens at a time; ``idle_tokens`` caps the round either way."""
        if self.config.fixed_tokens is not None:
            return RoundBudget(self.config.fixed_tokens, None)
        if decoding == 0:  # slicing an idle round is the adder's call (a long prompt's plan)
            return RoundBudget(self.config.idle_tokens, None)
        seconds = self.slice_seconds(decoding)
        if seconds is not None and can_slice and waiting == 1:
            return RoundBudget(self.config.slice_tokens, seconds, sliced=True)
        ratio = self.config.ride_ratio
        if ratio is not None and ride_capacity > 0 and waiting == 1:
            return RoundBudget(ride_capacity, ratio * self._decode_s, ride=True)
        if self.config.busy_tokens is not None:
            share = self.config.busy_tokens * max(1, waiting)
            return RoundBudget(min(self.config.idle_tokens, share), None)
        return RoundBudget(self.config.idle_tokens, self.config.gap_ratio * self._decode_s)

    def cost(self, tokens: int, position: int, *, ride: bool = False) -> float:
        """Predicted seconds of one forward pass over ``tokens`` prompt tokens at ``position``
        (``ride``: what they add to a decode step)."""
        c, a, b = self.coefficients(ride=ride)
        return c + tokens * (a + b * (position + tokens / 2))

    def tokens_within(self, seconds: float, position: int, *, ride: bool = False) -> int:
        """Largest chunk at ``position`` predicted to take at most ``seconds``."""
        c, a, b = self.coefficients(ride=ride)
        left = seconds - c
        if left <= 0:
            return 0
        base = a + b * position
        if b <= 0:
            return int(left / max(base, 1e-6))
        return max(0, int((-base + math.sqrt(base * base + 2 * b * left)) / b))  # b/2 n^2 + base n

    def coefficients(self, *, ride: bool = False) -> tuple[float, float, float]:
        """(seconds per pass, per token, per token per position of context)."""
        c, a, b = (self._ride_fit if ride else self._fit).solve()
        return max(c, 0.0), max(a, 1e-5), max(b, 0.0)


class _LeastSquares:
    """Ordinary least squares in three features with exponential forgetting, seeded with a
    prior worth a few observations so the first rounds are sane."""

    def __init__(self, prior: tuple[float, float, float], decay: float = 0.97) -> None:
        self._decay = decay
        self._prior = prior
        self._xx = [[0.0] * 3 for _ in range(3)]
        self._xt = [0.0] * 3
        for tokens, position in ((8, 0), (64, 0), (256, 0), (64, 2048), (256, 4096)):
            x = (1.0, float(tokens), tokens * (position + tokens / 2))
            self.add(x, prior[0] + prior[1] * x[1] + prior[2] * x[2])

    def add(self, x: tuple[float, float, float], t: float) -> None:
        for i in range(3):
            self._xt[i] = self._decay * self._xt[i] + x[i] * t
            for j in range(3):
                self._xx[i][j] = self._decay * self._xx[i][j] + x[i] * x[j]

    def solve(self) -> tuple[float, float, float]:
        m = [[*row, self._xt[i]] for i, row in enumerate(self._xx)]
        for col in range(3):  # Gauss-Jordan with partial pivoting on a 3x3 system
            pivot = max(range(col, 3), key=lambda r: abs(m[r][col]))
            if abs(m[pivot][col]) < 1e-18:
                return self._prior
            m[col], m[pivot] = m[pivot], m[col]
            for r in range(3):
                if r != col:
                    factor = m[r][col] / m[col][col]
                    m[r] = [v - factor * w for v, w in zip(m[r], m[col], strict=True)]
        return (m[0][3] / m[0][0], m[1][3] / m[1][1], m[2][3] / m[2][2])
