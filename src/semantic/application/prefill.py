"""Prefill planning: which prompt chunks run in a round, within its token budget."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from semantic.application.active_request import ActiveRequest

Admit = Callable[[ActiveRequest], bool]
"""Reserve memory and open the cache for a waiting request; False if it must keep waiting."""

Plan = list[tuple[ActiveRequest, int]]


class PrefillPlanner(Protocol):
    def plan(
        self,
        prefilling: Sequence[ActiveRequest],
        waiting: Sequence[ActiveRequest],
        budget: int,
        *,
        room: int,
        admit: Admit,
    ) -> Plan:
        """Chunks for this round: requests already prefilling keep their place at the front;
        then waiting requests are admitted (at most ``room``) while the budget lasts."""
        ...


def aligned_chunks(active: ActiveRequest, chunk_tokens: int, budget: int) -> list[int]:
    """Sizes of the next chunks of ``active``'s prompt that fit in ``budget`` tokens.

    Chunks end on multiples of ``chunk_tokens`` counted from the start of the prompt, so a
    prompt whose prefix was restored computes the rest in the same chunks a cold prefill of
    the whole prompt would (which keeps warm and cold results equal).
    """
    sizes: list[int] = []
    position, end = active.prefilled, len(active.prompt)
    while budget > 0 and position < end:
        boundary = (position // chunk_tokens + 1) * chunk_tokens
        n = min(boundary - position, end - position, budget)
        sizes.append(n)
        position += n
        budget -= n
    return sizes


class SimplePrefillPlanner:
    """First come, first served; a request that does not fit in memory blocks the line."""

    def __init__(self, chunk_tokens: int) -> None:
        self._chunk = chunk_tokens

    def plan(
        self,
        prefilling: Sequence[ActiveRequest],
        waiting: Sequence[ActiveRequest],
        budget: int,
        *,
        room: int,
        admit: Admit,
    ) -> Plan:
        plan: Plan = []
        for active in prefilling:
            sizes = aligned_chunks(active, self._chunk, budget)
            plan += [(active, n) for n in sizes]
            budget -= sum(sizes)
        for active in list(waiting):
            if budget <= 0 or room <= 0 or not admit(active):
                break
            room -= 1
            sizes = aligned_chunks(active, self._chunk, budget)
            plan += [(active, n) for n in sizes]
            budget -= sum(sizes)
        return plan
