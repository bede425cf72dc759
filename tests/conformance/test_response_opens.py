"""A response is queued before its first token exists, and says so: the Responses API's
stream opens then (``response.created``), as OpenAI's does, where it used to wait for the
first token (a cold prompt's seconds of prefill with not a byte sent)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from semantic.application.agents.responses import ResponseAsk, ResponseEvent
from semantic.application.agents.values import CommittedReply, Turn, TurnStarted
from semantic.application.chat.generation import TextDelta
from tests.conformance.conftest import ModelDirs
from tests.conformance.serving import serving, settings_for
from tests.conformance.tiny_models import Variant

pytestmark = pytest.mark.model  # the embedded model's tokenizer


def test_a_response_says_it_is_queued_before_its_first_token(
    model_dir: ModelDirs, tmp_path: Path
) -> None:
    settings = settings_for(model_dir(Variant("llama", False, "float32")), tmp_path)

    async def create() -> list[ResponseEvent]:
        async with serving(settings) as services:
            ask = ResponseAsk("resp_opens", Turn("Say hello.", max_tokens=4))
            return [event async for event in services.responses.create("ns", ask, lambda _: [])]

    events = asyncio.run(create())
    assert isinstance(events[0], TurnStarted)
    assert not any(isinstance(event, TurnStarted) for event in events[1:])
    assert any(isinstance(event, TextDelta) for event in events)
    assert isinstance(events[-1], CommittedReply)
