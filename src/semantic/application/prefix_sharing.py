"""A request sharing a long prefix with a running one copies it instead of computing it.

Agents a framework starts together often share a long system prompt, and none of them finds
it cached: the first has not finished, so nothing of it is stored yet. Each computed it, and
twelve agents with one 624-token system prompt waited 17-23 s for their first tokens (QA pass
9). Now a request admitted while an earlier one runs with a prefix they share (at least a
block more than it restored) follows that leader: it computes nothing until the leader's
prefill has passed the shared part (at once if the leader already decodes), then its cache
starts as a copy of the leader's and it prefills only the rest. A leader that ends first
lets its followers go, to prefill on their own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from semantic.application.active_request import ActiveRequest, Phase
from semantic.domain.tokens import common_prefix, reusable_prefix


@dataclass(frozen=True, slots=True)
class Follower:
    request: ActiveRequest
    shared: int
    """Prompt tokens it will copy from its leader."""


class PrefixSharing:
    def __init__(self, min_shared: int) -> None:
        """``min_shared``: tokens a request must be spared to wait for a leader (a block:
        a shorter prefix costs less to compute than the rounds spent waiting for it)."""
        self._min_shared = min_shared
        self._followers: dict[str, list[Follower]] = {}  # by leader id

    def follow(self, active: ActiveRequest, running: Iterable[ActiveRequest]) -> str | None:
        """Make ``active`` (admitted now) follow the running request it shares the longest
        prefix with, if that spares it a block or more; returns the leader's id. A leader
        already decoding holds its whole prompt, so its followers copy at once."""
        best: Follower | None = None
        leader: ActiveRequest | None = None
        least = active.n_cached + self._min_shared
        for other in running:
            if other is active or other.phase is Phase.WAITING or other.following:
                continue
            if other.request.namespace != active.request.namespace:
                continue  # tenants never share KV, as in the cache (ADR 0005)
            if other.prompt[:least] != active.prompt[:least]:
                continue  # one comparison in C rules out most requests
            shared = reusable_prefix(common_prefix(other.prompt, active.prompt), len(active.prompt))
            if shared - active.n_cached >= self._min_shared and (
                best is None or shared > best.shared
            ):
                best, leader = Follower(active, shared), other
        if best is None or leader is None:
            return None
        active.following = leader.id
        self._followers.setdefault(leader.id, []).append(best)
        return leader.id

    def ready(self, leader: ActiveRequest) -> list[Follower]:
        """Followers whose shared prefix ``leader`` has now prefilled; they stop waiting."""
        waiting = self._followers.pop(leader.id, [])
        done = [f for f in waiting if f.shared <= leader.prefilled]
        rest = [f for f in waiting if f.shared > leader.prefilled]
        if rest:
            self._followers[leader.id] = rest
        for follower in done:
            follower.request.following = None
        return done

    def end(self, active: ActiveRequest) -> None:
        """``active`` ends or goes back to the queue: its followers prefill on their own,
        and if it was waiting for a leader, it no longer is."""
        for follower in self._followers.pop(active.id, []):
            follower.request.following = None
        if active.following is not None:
            left = [f for f in self._followers.get(active.following, []) if f.request is not active]
            self._followers[active.following] = left
            active.following = None
