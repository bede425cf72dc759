from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from semantic.domain.block_identity import block_key, chain_keys, chain_root

TOKENS = st.lists(st.integers(0, 2**32 - 1), max_size=40)
ROOT = chain_root("model-a", "default")


@given(TOKENS, TOKENS)
def test_shared_prefixes_share_block_ids(prefix: list[int], tail: list[int]) -> None:
    a = chain_keys(ROOT, prefix + tail, 4)
    b = chain_keys(ROOT, prefix + [t ^ 1 for t in tail], 4)
    shared = len(prefix) // 4
    assert a[:shared] == b[:shared]


def test_a_block_id_depends_on_everything_before_it() -> None:
    first = chain_keys(ROOT, [1, 2, 3, 4, 5, 6, 7, 8], 4)
    second = chain_keys(ROOT, [9, 2, 3, 4, 5, 6, 7, 8], 4)
    assert first[1] != second[1]


def test_another_model_or_namespace_never_gets_the_same_ids() -> None:
    tokens = [1, 2, 3, 4]
    ids = {
        chain_keys(chain_root(model, namespace), tokens, 4)[0]
        for model in ("model-a", "model-b")
        for namespace in ("default", "tenant-2")
    }
    assert len(ids) == 4


def test_a_partial_block_is_distinct_from_the_full_block_it_grows_into() -> None:
    assert block_key(ROOT, [1, 2, 3]) != block_key(ROOT, [1, 2, 3, 0])
    assert len(chain_keys(ROOT, [1, 2, 3, 4, 5], 4, include_partial=True)) == 2
    assert len(chain_keys(ROOT, [1, 2, 3, 4, 5], 4)) == 1
