"""The Responses and Conversations APIs through the official ``openai`` SDK, on the embedded
model: chains resume from stored KV (after a restart too), branch copy-on-write, streams
reassemble to what is stored, and bad input is refused by name."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, cast

import httpx
import openai
import pytest
from openai.types.responses import ResponseCompletedEvent, ResponseIncompleteEvent
from reliability.server import ServerProcess

pytestmark = pytest.mark.model

Start = Callable[..., ServerProcess]


def client(server: ServerProcess, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="unused", default_headers=headers, max_retries=0
    )


def ask(server: ServerProcess, text: Any, **fields: Any) -> Any:
    return client(server).responses.create(
        model="default", input=text, max_output_tokens=12, temperature=0, **fields
    )


def test_a_chain_resumes_from_its_blocks_after_a_restart(new_server: Start) -> None:
    first_server = new_server()
    brief = {"instructions": "Answer briefly."}  # not carried along a chain: sent each turn
    first = ask(first_server, "Name three colours.", **brief)
    assert first.status in ("completed", "incomplete")
    assert first.output_text
    warm = ask(first_server, "Which one is the warmest?", previous_response_id=first.id, **brief)
    done = first.usage.input_tokens + first.usage.output_tokens
    assert warm.usage.input_tokens_details.cached_tokens >= 0.9 * done
    first_server.stop()
    second_server = new_server(data_dir=first_server.data_dir)
    again = ask(second_server, "Which one is the warmest?", previous_response_id=first.id, **brief)
    assert again.usage.input_tokens_details.cached_tokens >= 0.9 * done
    assert again.output_text == warm.output_text
    kept = client(second_server).responses.retrieve(warm.id)
    assert kept.output_text == warm.output_text
    assert kept.previous_response_id == first.id


def test_streamed_events_reassemble_to_the_stored_response(server: ServerProcess) -> None:
    events = list(
        client(server).responses.create(
            model="default", input="Say hello.", max_output_tokens=10, temperature=0, stream=True
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    last = events[-1]
    assert isinstance(last, ResponseCompletedEvent | ResponseIncompleteEvent)
    final = last.response
    stored = client(server).responses.retrieve(final.id)
    assert text == stored.output_text == final.output_text
    assert stored.usage is not None
    assert final.usage is not None
    assert stored.usage.output_tokens == final.usage.output_tokens


def _dump(item: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = item if isinstance(item, dict) else item.model_dump()
    return dumped


def _text(item: Any) -> str:
    return "".join(part["text"] for part in _dump(item)["content"])


def _blocks(server: ServerProcess) -> int:
    with sqlite3.connect(server.data_dir / "semantic.db") as db:
        return int(db.execute("SELECT count(*) FROM blocks").fetchone()[0])


def test_two_responses_on_one_previous_id_branch(server: ServerProcess) -> None:
    rules = " ".join(f"Rule {i}: answer in one short sentence." for i in range(60))
    root = ask(server, "Name a fruit.", instructions=rules)
    before = _blocks(server)
    left = ask(server, "Is it sweet?", previous_response_id=root.id, instructions=rules)
    middle = _blocks(server)
    right = ask(server, "What colour is it?", previous_response_id=root.id, instructions=rules)
    after = _blocks(server)
    shared = root.usage.input_tokens + root.usage.output_tokens
    assert right.usage.input_tokens_details.cached_tokens >= 0.9 * shared
    new_tokens = right.usage.input_tokens + right.usage.output_tokens - shared
    assert after - middle <= new_tokens // 256 + 2  # only its own blocks: nothing copied
    assert (
        middle - before <= (left.usage.input_tokens + left.usage.output_tokens - shared) // 256 + 2
    )
    items = client(server).responses.input_items.list(right.id)
    assert [_text(i) for i in items.data] == ["What colour is it?"]
    on_left = ask(server, "Why?", previous_response_id=left.id, instructions=rules)
    assert on_left.usage.input_tokens_details.cached_tokens >= left.usage.input_tokens
    client(server).responses.delete(left.id)
    # on_left's blocks stay when left is deleted
    later = ask(server, "Really?", previous_response_id=on_left.id, instructions=rules)
    done = on_left.usage.input_tokens + on_left.usage.output_tokens
    assert later.usage.input_tokens_details.cached_tokens >= 0.9 * done
    client(server).responses.delete(later.id)
    client(server).responses.delete(on_left.id)
    assert _blocks(server) == before + (after - middle)  # what only they held is freed
    again = ask(server, "What colour is it?", previous_response_id=root.id, instructions=rules)
    assert again.output_text == right.output_text


def test_a_deleted_response_and_another_namespace_are_404(server: ServerProcess) -> None:
    first = ask(server, "Name a river.")
    other = client(server, **{"X-Namespace": "elsewhere"})
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError):  # OpenAI's 400, as below
        other.responses.create(model="default", input="Hi", previous_response_id=first.id)
    client(server).responses.delete(first.id)
    with pytest.raises(openai.BadRequestError) as missing:
        ask(server, "And another?", previous_response_id=first.id)
    assert missing.value.code == "previous_response_not_found"  # what clients recover by
    assert missing.value.param == "previous_response_id"
    assert "- Previous response with id 'resp_" in missing.value.message
    with pytest.raises(openai.NotFoundError):
        client(server).responses.retrieve(first.id)


def test_store_false_keeps_nothing_a_client_can_name_but_its_prompt_stays_cached(
    server: ServerProcess,
) -> None:
    """A stateless client sends the whole conversation each turn: as at OpenAI, what it
    sent before is cached though no response is stored."""
    said: list[Any] = [{"role": "user", "content": "Name a bird."}]
    unstored = ask(server, said, store=False, instructions="Be brief.")
    assert unstored.output_text
    with pytest.raises(openai.NotFoundError):
        client(server).responses.retrieve(unstored.id)
    said += [{"role": "assistant", "content": unstored.output_text}]
    said += [{"role": "user", "content": "And a fish?"}]
    again = ask(server, said, store=False, instructions="Be brief.")
    assert again.usage.input_tokens_details.cached_tokens >= unstored.usage.input_tokens


def test_a_conversation_keeps_its_items_in_order(server: ServerProcess) -> None:
    api = client(server)
    conversation = api.conversations.create(
        items=[{"type": "message", "role": "user", "content": "My name is Ada."}],
        metadata={"topic": "names"},
    )
    api.conversations.items.create(
        conversation.id,
        items=[{"type": "message", "role": "user", "content": "I live in Paris."}],
    )
    reply = ask(server, "Where do I live?", conversation=conversation.id)
    assert reply.conversation is not None
    assert reply.conversation.id == conversation.id
    items = [_dump(i) for i in api.conversations.items.list(conversation.id, order="asc").data]
    assert [i["type"] for i in items] == ["message"] * 4
    assert [i["role"] for i in items] == ["user", "user", "user", "assistant"]
    assert [_text(i) for i in items] == [
        "My name is Ada.",
        "I live in Paris.",
        "Where do I live?",
        reply.output_text,
    ]
    assert items[3]["id"] == reply.output[0].id  # the reply's item, under its own id
    assert api.conversations.items.retrieve(reply.output[0].id, conversation_id=conversation.id)
    first_page = api.conversations.items.with_raw_response.list(
        conversation.id, limit=2, order="asc"
    ).http_response.json()
    assert [i["id"] for i in first_page["data"]] == [items[0]["id"], items[1]["id"]]
    assert first_page["has_more"]
    rest = api.conversations.items.list(conversation.id, limit=2, order="asc", after=items[1]["id"])
    assert [_dump(i)["id"] for i in rest.data] == [items[2]["id"], items[3]["id"]]
    again = ask(server, "And my name?", conversation=conversation.id)  # resumes its blocks
    done = reply.usage.input_tokens + reply.usage.output_tokens
    assert again.usage.input_tokens_details.cached_tokens >= 0.9 * done
    api.conversations.items.delete(items[1]["id"], conversation_id=conversation.id)
    left = [_dump(i)["id"] for i in api.conversations.items.list(conversation.id, order="asc")]
    assert left[:3] == [items[0]["id"], items[2]["id"], items[3]["id"]]
    assert len(left) == 5
    follow = ask(server, "What is my name?", conversation=conversation.id)
    assert follow.output_text
    assert len(api.conversations.items.list(conversation.id, limit=100).data) == 7
    assert api.conversations.retrieve(conversation.id).metadata == {"topic": "names"}
    api.conversations.delete(conversation.id)
    with pytest.raises(openai.NotFoundError):
        ask(server, "Hello?", conversation=conversation.id)


def test_a_call_result_without_its_call_never_breaks_a_conversation(
    server: ServerProcess,
) -> None:
    """A ``function_call_output`` added alone is refused at once, naming ``items``; one
    whose call was deleted since is left out of what the next response reads (it failed
    every response after it, naming an ``input`` index no request held)."""
    api = client(server)
    call = {"type": "function_call", "call_id": "call_a", "name": "f", "arguments": "{}"}
    result = {"type": "function_call_output", "call_id": "call_a", "output": "x"}
    asked = {"type": "message", "role": "user", "content": "hi"}
    conversation = api.conversations.create(items=cast("Any", [asked, call, result]))
    with pytest.raises(openai.BadRequestError, match="answers no function_call") as refused:
        api.conversations.items.create(
            conversation.id, items=cast("Any", [{**result, "call_id": "call_nope"}])
        )
    assert refused.value.param == "items"
    with pytest.raises(openai.BadRequestError, match="answers no function_call"):
        api.conversations.create(items=cast("Any", [asked, result]))
    items = api.conversations.items.list(conversation.id, order="asc").data
    [made] = [i for i in items if i.type == "function_call"]
    api.conversations.items.delete(made.id, conversation_id=conversation.id)
    assert ask(server, "Again?", conversation=conversation.id).status in (
        "completed",
        "incomplete",
    )


def _refused(server: ServerProcess, body: dict[str, Any]) -> dict[str, Any]:
    reply = httpx.post(
        f"{server.url}/v1/responses",
        json={"model": "default", "max_output_tokens": 4, **body},
        timeout=60,
    )
    assert reply.status_code == 400, reply.text
    error: dict[str, Any] = reply.json()["error"]
    return error


def test_bad_input_is_refused_by_name(server: ServerProcess) -> None:
    image = {"type": "input_image", "image_url": "https://example.com/a.png"}
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"input": [{"role": "user", "content": [image]}]}, "input", "input[0].content[0]"),
        ({"input": ["Hi", {"type": "web_search_call", "id": "ws_1"}]}, "input", "input[1]"),
        (
            {"input": [{"type": "reasoning", "encrypted_content": "x", "summary": []}]},
            "input",
            "input[0]",
        ),
        ({"input": "Hi", "background": True}, "background", "background"),
        ({"input": "Hi", "tools": [{"type": "web_search"}]}, "tools", "web_search"),
        (
            {"input": "Hi", "previous_response_id": "resp_a", "conversation": "conv_b"},
            "conversation",
            "not both",
        ),
        ({"input": "Hi", "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", "<= 16"),
        ({"input": "Hi", "include": ["bogus.value"]}, "include", "'bogus.value' is not one of"),
        ({"input": "Hi", "metadata": {"k": "v" * 513}}, "metadata[...]", "<= 512"),
    ]
    for body, param, named in cases:
        if isinstance(body["input"], list) and body["input"] and body["input"][0] == "Hi":
            body["input"][0] = {"role": "user", "content": "Hi"}
        error = _refused(server, body)
        assert error["param"] == param, error
        assert named in error["message"], error
    missing = httpx.post(
        f"{server.url}/v1/responses",
        json={"model": "default", "input": "Hi", "conversation": "conv_missing"},
        timeout=60,
    )
    assert missing.status_code == 404
    many = [{"type": "message", "role": "user", "content": "hi"}] * 21
    too_many = httpx.post(f"{server.url}/v1/conversations", json={"items": many})
    assert too_many.status_code == 400
    assert too_many.json()["error"]["param"] == "items"
    quiet: Any = {"input": "Hi", "max_output_tokens": 2, "include": ["reasoning.encrypted_content"]}
    made = client(server).responses.create(model="default", **quiet)  # what Codex sends
    streamed = httpx.get(f"{server.url}/v1/responses/{made.id}", params={"stream": "true"})
    assert streamed.status_code == 400  # not an empty stream
    assert streamed.json()["error"]["param"] == "stream"
    compact = httpx.post(f"{server.url}/v1/responses/compact", json={"input": "Hi"})
    assert compact.status_code == 404  # the SDK's; not a 405 from /{id}
    assert "no endpoint at POST" in compact.json()["error"]["message"]


def test_input_tokens_counts_the_prompt_the_response_then_takes(server: ServerProcess) -> None:
    """``responses.input_tokens.count`` renders the chain, instructions and tools as the
    response does: its count is the response's ``usage.input_tokens``."""
    openai = client(server)
    first = openai.responses.create(model="default", input="Name a colour.", max_output_tokens=4)
    assert first.usage is not None
    tool: Any = {
        "type": "function",
        "name": "paint",
        "description": "Paint a wall.",
        "parameters": {"type": "object", "properties": {"colour": {"type": "string"}}},
    }
    asked: Any = {
        "model": "default",
        "input": "And another?",
        "instructions": "Answer in one word.",
        "previous_response_id": first.id,
    }
    plain = openai.responses.input_tokens.count(**asked)
    with_tool = openai.responses.input_tokens.count(**asked, tools=[tool])
    assert plain.object == "response.input_tokens"
    assert with_tool.input_tokens > plain.input_tokens > first.usage.input_tokens
    made = openai.responses.create(**asked, tools=[tool], max_output_tokens=4)
    assert made.usage is not None
    assert made.usage.input_tokens == with_tool.input_tokens
    gone = httpx.post(
        f"{server.url}/v1/responses/input_tokens",
        json={"input": "Hi", "previous_response_id": "resp_missing"},
    )
    assert gone.status_code == 400  # as a response on it is refused
    assert gone.json()["error"]["code"] == "previous_response_not_found"
    unknown = httpx.post(f"{server.url}/v1/responses/input_tokens", json={"stream": True})
    assert unknown.status_code == 400
    assert "stream" in unknown.json()["error"]["message"]
