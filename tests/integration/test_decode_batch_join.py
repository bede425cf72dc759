"""A lone sequence in the decode batch: its caches become the batch's, and back."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest

from semantic.adapters.mlx import decode_batch
from semantic.adapters.mlx.kv import batch_caches
from semantic.domain.chat import ChatMessage
from tests.helpers import generate, kv_of_both
from tests.integration.conftest import EngineFactory, RealModel

pytestmark = pytest.mark.model


def same_buffers(ours: list[Any] | None, theirs: list[Any]) -> bool:
    return ours is not None and all(
        a.keys is b.keys and a.values is b.values for a, b in zip(ours, theirs, strict=True)
    )


def test_a_lone_row_joins_and_leaves_on_its_own_buffers_with_the_bits_of_copies(
    real_model: RealModel, make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Merging copied the newcomer's whole KV into buffers without room, which the next
    pass then grew (copied) again: 143-156 ms of a returning 4K agent's second token; and
    extracting the last row copied it once more. A batch of one now holds the very
    buffers its prefill (or restore) made, and hands them back when the row leaves; the
    reply and its KV are the bits of the copying path."""
    engine, _ = make_engine()
    prompt = real_model.tokenizer.render_chat([ChatMessage("user", "Tell me a story.")])
    adopt, hand_back = batch_caches.adopted, batch_caches.handed_back
    held: list[bool] = []

    def adopting(caches: list[Any]) -> list[Any] | None:
        held.append(same_buffers(adopt(caches), caches))
        return adopt(caches)

    def handing_back(batch: list[Any]) -> list[Any] | None:
        held.append(same_buffers(hand_back(batch), batch))
        return hand_back(batch)

    monkeypatch.setattr(decode_batch, "adopted", adopting)
    monkeypatch.setattr(decode_batch, "handed_back", handing_back)
    own = generate(engine, prompt, 12)
    assert held == [True, True]
    monkeypatch.setattr(decode_batch, "adopted", lambda _: None)
    monkeypatch.setattr(decode_batch, "handed_back", lambda _: None)
    copied = generate(engine, prompt, 12)
    assert own.token_ids == copied.token_ids
    for ours, theirs in kv_of_both(own, copied):
        assert mx.array_equal(ours, theirs).item()
