"""A lone sequence joining an empty decode batch: its caches become the batch's."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest

from semantic.adapters.mlx import decode_batch
from semantic.domain.chat import ChatMessage
from tests.helpers import generate, kv_of_both
from tests.integration.conftest import EngineFactory, RealModel

pytestmark = pytest.mark.model


def test_a_lone_newcomer_keeps_its_buffers_and_decodes_as_when_merged(
    real_model: RealModel, make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Merging copied the newcomer's whole KV into buffers without room, which the next
    pass then grew (copied) again: 143-156 ms of a returning 4K agent's second token. The
    batch of one now holds the very buffers its prefill (or restore) made, and the reply
    and its KV are the bits a merged batch gives."""
    engine, _ = make_engine()
    prompt = real_model.tokenizer.render_chat([ChatMessage("user", "Tell me a story.")])
    real_adopted = decode_batch._adopted  # noqa: SLF001 - the join under test
    held: list[bool] = []

    def spying(caches: list[Any]) -> list[Any] | None:
        batch = real_adopted(caches)
        held.append(
            batch is not None
            and all(
                b.keys is c.keys and b.values is c.values
                for b, c in zip(batch, caches, strict=True)
            )
        )
        return batch

    monkeypatch.setattr(decode_batch, "_adopted", spying)
    adopted = generate(engine, prompt, 12)
    assert held == [True]
    monkeypatch.setattr(decode_batch, "_adopted", lambda _: None)
    merged = generate(engine, prompt, 12)
    assert adopted.token_ids == merged.token_ids
    for ours, theirs in kv_of_both(adopted, merged):
        assert mx.array_equal(ours, theirs).item()
