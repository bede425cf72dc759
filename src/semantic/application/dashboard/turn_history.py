"""The last turns of each agent and the last hour by minute, kept in memory for the dashboard.

Prometheus keeps counters since the start and leaves history to its scraper; a person
opening the page wants "what did this agent's last turns cost" and "how did the last hour
go" without running one. Both are bounded: a few turns for each of the most recently seen
agents, and one bucket per namespace and minute for an hour, whose first-token times are
sampled past a cap, so a busy server holds the same memory as an idle one.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from semantic.domain.generation import FinishedRequest

MINUTE_S = 60.0


@dataclass(frozen=True, slots=True)
class MinuteSample:
    """One minute of finished requests (of the namespaces asked for)."""

    start: float
    """Wall-clock seconds at the minute's start."""
    requests: int
    prompt_tokens: int
    cached_tokens: int
    ttft_p50_s: float | None
    ttft_p95_s: float | None

    @property
    def hit_rate(self) -> float | None:
        """Prompt tokens not computed, of those received."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None


@dataclass(slots=True)
class _Bucket:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    first_tokens: list[float] = field(default_factory=list)


class TurnHistory:
    """A ``GenerationObserver`` fed each finished request; read by the dashboard on the
    event loop that feeds it."""

    def __init__(
        self,
        *,
        turns_per_agent: int = 20,
        agents: int = 10_000,
        minutes: int = 60,
        samples_per_minute: int = 2048,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._turns_per_agent = turns_per_agent
        self._max_agents = agents
        self._minutes = minutes
        self._samples = samples_per_minute
        self._clock = clock
        self._turns: OrderedDict[tuple[str, str], deque[FinishedRequest]] = OrderedDict()
        self._buckets: dict[tuple[str, int], _Bucket] = {}

    def on_first_token(self, seconds: float) -> None:
        """Counted with the request's end (``FinishedRequest.first_token_s``)."""

    def on_token_gap(self, seconds: float) -> None:
        """Not shown on the page."""

    def on_abandoned(self) -> None:
        """Not shown on the page: the metrics count them."""

    def on_finished(self, finished: FinishedRequest) -> None:
        key = (finished.namespace, finished.agent_id)
        turns = self._turns.pop(key, None) or deque(maxlen=self._turns_per_agent)
        turns.append(finished)
        self._turns[key] = turns  # the most recent last
        while len(self._turns) > self._max_agents:
            self._turns.popitem(last=False)
        self._count(finished)

    def recent(self, namespace: str, agent_id: str) -> tuple[FinishedRequest, ...]:
        """The agent's last turns, oldest first."""
        return tuple(self._turns.get((namespace, agent_id), ()))

    def cached_share(self, namespace: str, agent_id: str) -> float | None:
        """Of the prompt tokens of the agent's last turns, the share not computed."""
        return _share(self._turns.get((namespace, agent_id), ()))

    def cached_shares(self) -> dict[tuple[str, str], float]:
        """``cached_share`` of every agent with turns here, by (namespace, agent id)."""
        shares = {key: _share(turns) for key, turns in self._turns.items()}
        return {key: share for key, share in shares.items() if share is not None}

    def last_hour(self, namespaces: Collection[str] | None = None) -> list[MinuteSample]:
        """One sample per minute, oldest first, the current minute last; ``namespaces``
        None: all of them."""
        now_minute = self._minute(self._clock())
        first = now_minute - self._minutes + 1
        self._forget_before(first)
        merged: dict[int, _Bucket] = {}
        for (namespace, minute), bucket in self._buckets.items():
            if namespaces is None or namespace in namespaces:
                into = merged.setdefault(minute, _Bucket())
                into.requests += bucket.requests
                into.prompt_tokens += bucket.prompt_tokens
                into.cached_tokens += bucket.cached_tokens
                into.first_tokens.extend(bucket.first_tokens)
        return [_sample(m, merged.get(m, _Bucket())) for m in range(first, now_minute + 1)]

    def _count(self, finished: FinishedRequest) -> None:
        minute = self._minute(finished.ended_at)
        bucket = self._buckets.setdefault((finished.namespace, minute), _Bucket())
        bucket.requests += 1
        bucket.prompt_tokens += finished.prompt_tokens
        bucket.cached_tokens += finished.stats.cached_tokens
        if finished.first_token_s is not None:
            _sampled(bucket, finished.first_token_s, self._samples)
        if len(self._buckets) % 256 == 0:
            self._forget_before(self._minute(self._clock()) - self._minutes + 1)

    def _forget_before(self, minute: int) -> None:
        for key in [key for key in self._buckets if key[1] < minute]:
            del self._buckets[key]

    @staticmethod
    def _minute(when: float) -> int:
        return int(when // MINUTE_S)


def _share(turns: Iterable[FinishedRequest]) -> float | None:
    prompt = cached = 0
    for turn in turns:
        prompt += turn.prompt_tokens
        cached += turn.stats.cached_tokens
    return cached / prompt if prompt else None


def _sampled(bucket: _Bucket, value: float, cap: int) -> None:
    """Past ``cap`` values, each new one replaces an earlier one in turn: the sample stays
    spread over the minute."""
    if len(bucket.first_tokens) < cap:
        bucket.first_tokens.append(value)
    else:
        bucket.first_tokens[bucket.requests % cap] = value


def _sample(minute: int, bucket: _Bucket) -> MinuteSample:
    ordered = sorted(bucket.first_tokens)
    return MinuteSample(
        minute * MINUTE_S,
        bucket.requests,
        bucket.prompt_tokens,
        bucket.cached_tokens,
        _percentile(ordered, 0.50),
        _percentile(ordered, 0.95),
    )


def _percentile(ordered: list[float], share: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]
