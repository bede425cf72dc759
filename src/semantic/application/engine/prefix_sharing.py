"""A request sharing a long prefix with a running one copies it instead of computing it.

Agents a framework starts together often share a long system prompt, and none of them finds
it cached: the first has not finished, so nothing of it is stored yet. Each computed it, and
twelve agents with one 624-token system prompt waited 17-23 s for their first tokens (QA pass
9). Now a request admitted while an earlier one runs with a prefix they share (at least a
block more than it restored) follows that leader: it computes nothing until the leader's
prefill has passed the shared part (at once if the leader already decodes), then its cache
starts as a copy of the leader's and it prefills only the rest. A leader that ends first
lets its followers go, to prefill on their own.

A request still queued when such a leader ends would find nothing: no leader runs when it
is admitted, and its cache lookup, made as it arrived, came before the leader's KV was
kept. Whatever arrived between them (another tenant's request ahead in the queue, a reply
of one token) cost it the whole prefix: with a ~986-token system prompt, a request queued
behind another namespace's was admitted after its leader had ended and computed all of it
(issue 32). So a leader that ends hands the KV it leaves to the queued requests of its
namespace that share a block more with it than they hold (``heirs``); they restore it as
they would from the cache.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from semantic.application.engine.active_request import ActiveRequest, Phase
from semantic.domain.blocks import AgentBlocks
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.tokens import common_prefix, reusable_prefix


@dataclass(frozen=True, slots=True)
class Follower:
    request: ActiveRequest
    shared: int
    """Prompt tokens it will copy from its leader."""


class PrefixSharing:
    def __init__(self, spec: ModelCacheSpec) -> None:
        """A request must be spared a block to wait for a leader (a shorter prefix costs
        less to compute than the rounds spent waiting for it)."""
        self._spec = spec
        self._min_shared = spec.block_tokens
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

    def heirs(
        self, leader: ActiveRequest, blocks: AgentBlocks, queued: Iterable[ActiveRequest]
    ) -> list[tuple[ActiveRequest, AgentBlocks]]:
        """The ``queued`` requests of ``leader``'s namespace (it ends, leaving ``blocks``)
        that would restore at least a block more from them than from the prefix they hold,
        each with the blocks of the part it shares. One that let its pin go to make room
        for others is left as it is."""
        heirs: list[tuple[ActiveRequest, AgentBlocks]] = []
        first = self._min_shared
        for waiting in queued:
            if waiting.request.namespace != leader.request.namespace:
                continue  # tenants never share KV, as in the cache (ADR 0005)
            if blocks.token_ids[:first] != waiting.prompt[:first]:
                continue  # one comparison in C rules out most requests
            cached = waiting.request.cached
            if cached is not None and not waiting.pinned:
                continue
            held = reusable_prefix(cached.matched if cached else 0, len(waiting.prompt))
            shared = common_prefix(blocks.token_ids, waiting.prompt)
            shared = reusable_prefix(shared, len(waiting.prompt))
            if shared - held >= self._min_shared and _covers(blocks, shared, self._spec):
                heirs.append((waiting, _first_blocks(blocks, shared, self._spec)))
        return heirs


def _first_blocks(blocks: AgentBlocks, n_tokens: int, spec: ModelCacheSpec) -> AgentBlocks:
    """The blocks holding ``blocks``' first ``n_tokens`` positions: an heir pins those
    only, not the leader's own rest (its prompt's tail, its reply)."""
    size = spec.block_tokens
    count = -(-n_tokens // size)
    layers = tuple(tuple(b for b in layer if b.index < count) for layer in blocks.layers)
    return AgentBlocks(blocks.agent_id, blocks.token_ids[: count * size], layers)


def _covers(blocks: AgentBlocks, n_tokens: int, spec: ModelCacheSpec) -> bool:
    """Whether ``blocks`` hold every position a cache of their first ``n_tokens`` reads: a
    sliding layer drops the blocks its window has passed, which a shorter prefix needs."""
    if not spec.has_sliding_layers:
        return True
    for layer, layer_blocks in enumerate(blocks.layers):
        window = spec.window(layer)
        needed = 0 if window is None else max(0, n_tokens - window)
        if not layer_blocks:
            return False
        first = layer_blocks[0]
        if first.index * spec.block_tokens + first.start > needed:
            return False
    return True
