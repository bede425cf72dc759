"""A generated call sent back re-serialized renders to the tokens that were generated, so the
next turn's prompt extends the previous prompt and reply token for token; the memory
behind it is in the metadata store, so it holds across a restart (ADR 0018)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from semantic.adapters.storage.sql_metadata import SqlMetadataStore
from semantic.application.chat.call_memory import CallMemory
from semantic.application.chat.tool_replies import ReplyReader
from semantic.domain.chat import ChatMessage
from semantic.domain.tools import ToolCall, checked_tools
from tests.integration.conftest import RealModel

pytestmark = pytest.mark.model

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
}


async def test_a_call_sent_back_renders_as_generated_also_after_a_restart(
    real_model: RealModel, tmp_path: Path
) -> None:
    tokenizer = real_model.tokenizer
    tools = checked_tools([("get_weather", "Weather in a city", WEATHER, None)])
    asked = [ChatMessage("system", "Be brief."), ChatMessage("user", "Weather in Paris?")]
    prompt = tokenizer.render_chat(asked, tools=tools)
    call = '{"name": "get_weather", "arguments": {"city":"Paris","days":2}}'
    raw = f"Looking.<tool_call>{call}</tool_call>"
    generated = [*tokenizer.encode(raw), min(tokenizer.eos_token_ids)]
    reader = ReplyReader(tokenizer.tool_format, lambda: "call_abc")
    reader.feed(raw)
    _, reply = reader.finish()
    assert [c.name for c in reply.calls] == ["get_weather"]
    store = SqlMetadataStore(tmp_path / "semantic.db")
    await store.open()
    await CallMemory(store).remember("ns", reply)
    await store.close()

    reopened = SqlMetadataStore(tmp_path / "semantic.db")  # as after a restart
    await reopened.open()
    resent = json.dumps({"days": 2, "city": "Paris"})  # the client's spacing and key order
    back = ChatMessage(
        "assistant", "Looking.", tool_calls=(ToolCall("call_abc", "get_weather", resent),)
    )
    result = ChatMessage("tool", "Sunny, 21 C", tool_call_id="call_abc")
    restored = await CallMemory(reopened).restore("ns", [*asked, back, result])
    await reopened.close()
    following = tokenizer.render_chat(restored, tools=tools)
    assert following[: len(prompt) + len(generated)] == prompt + generated
    assert len(following) > len(prompt) + len(generated)
    unmatched = tokenizer.render_chat([*asked, back, result], tools=tools)
    assert unmatched[: len(prompt) + len(generated)] != prompt + generated  # why it is kept
