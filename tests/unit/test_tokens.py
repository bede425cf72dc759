from __future__ import annotations

import random

import pytest

from semantic.domain.tokens import common_prefix, reusable_prefix


@pytest.mark.parametrize("differs_at", [0, 1, 255, 256, 257, 511, 512, 600, 999])
def test_the_first_differing_token_is_found_wherever_it_falls(differs_at: int) -> None:
    a = [random.Random(differs_at).randrange(50_000) for _ in range(1_000)]
    b = list(a)
    b[differs_at] += 1
    assert common_prefix(a, tuple(b)) == differs_at
    assert common_prefix(tuple(b), a) == differs_at


def test_a_sequence_shares_all_of_itself_with_anything_it_begins() -> None:
    a = tuple(range(700))
    assert common_prefix(a, list(range(900))) == 700
    assert common_prefix(list(range(900)), a) == 700
    assert common_prefix(a, a) == 700
    assert common_prefix((), a) == 0


def test_the_last_prompt_token_is_never_counted_as_reusable() -> None:
    assert reusable_prefix(10, 10) == 9  # a whole prompt cached: its last token is still fed
    assert reusable_prefix(4, 10) == 4
    assert reusable_prefix(0, 1) == 0
