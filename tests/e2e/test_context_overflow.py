"""Conversations that outgrow the model's window keep answering, and stay cached: the
Responses API's ``truncation: "auto"`` (also through the OpenAI Agents SDK) and
Anthropic's ``clear_tool_uses_20250919`` context edit (issue 48). The server serves a
1,024-token window (``--max-context``) so a few turns reach it."""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from agents import Agent, ModelSettings, OpenAIResponsesModel, RunConfig, Runner
from reliability.server import ServerProcess

from semantic.domain.context_edits import CLEARED_RESULT

pytestmark = pytest.mark.model

WINDOW = 1024
INSTRUCTIONS = "You are a terse assistant. Answer in a few words."
TOPICS = ["rivers", "mountains", "deserts", "forests", "oceans", "islands", "glaciers", "lakes"]


def question(topic: str) -> str:
    """About 150 tokens: six or seven of them fill the window."""
    facts = " ".join(f"Fact {i} about {topic}: they shape the land around them." for i in range(12))
    return f"{facts} Name one famous example of {topic}."


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    served = tmp_path_factory.mktemp("small-window")
    process = ServerProcess(served, "--max-context", str(WINDOW)).start()
    yield process
    assert process.stop() == 0


def oai(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_a_responses_chain_past_the_window_truncates_and_stays_cached(
    small: ServerProcess,
) -> None:
    client = oai(small)
    turns: list[tuple[str, str]] = []  # each turn's input and reply, in order
    usages = []
    previous = None
    for topic in TOPICS:
        reply = client.responses.create(
            model="default",
            instructions=INSTRUCTIONS,
            input=question(topic),
            previous_response_id=previous,
            truncation="auto",
            max_output_tokens=12,
            temperature=0,
        )
        assert reply.status in ("completed", "incomplete")
        turns.append((question(topic), reply.output_text))
        assert reply.usage is not None
        usages.append(reply.usage)
        previous = reply.id
    sizes = [u.input_tokens for u in usages]
    cut = next(i for i in range(1, len(sizes)) if sizes[i] < sizes[i - 1])  # truncated here
    assert all(size < WINDOW for size in sizes)
    kept = usages[cut].input_tokens + usages[cut].output_tokens
    after = usages[cut + 1].input_tokens_details.cached_tokens
    assert after >= 0.9 * kept, (sizes, after, kept)  # the next turn grew from it, cached
    equal_to_a_cold_run(client, turns, cut, usages[cut].input_tokens)


def equal_to_a_cold_run(
    client: openai.OpenAI, turns: list[tuple[str, str]], cut: int, prompt_tokens: int
) -> None:
    """The truncated turn's reply is what the edited history gives cold: its kept turns are
    the last ones whose prompt has the truncated turn's size."""
    for first in reversed(range(cut)):  # the fewest turns kept first: the prompt grows
        messages: list[Any] = [{"role": "system", "content": INSTRUCTIONS}]
        for asked, answered in turns[first:cut]:
            messages += [
                {"role": "user", "content": asked},
                {"role": "assistant", "content": answered},
            ]
        messages.append({"role": "user", "content": turns[cut][0]})
        cold = client.chat.completions.create(
            model="default", messages=messages, max_tokens=12, temperature=0
        )
        assert cold.usage is not None
        if cold.usage.prompt_tokens == prompt_tokens:
            assert cold.choices[0].message.content == turns[cut][1]
            return
        if cold.usage.prompt_tokens > prompt_tokens:
            break
    pytest.fail(f"no run of the last turns before turn {cut} has {prompt_tokens} tokens")


def test_the_agents_sdk_runs_past_the_window_with_truncation_auto(small: ServerProcess) -> None:
    client = openai.AsyncOpenAI(base_url=f"{small.url}/v1", api_key="unused", max_retries=0)
    agent = Agent(
        name="terse",
        instructions=INSTRUCTIONS,
        model=OpenAIResponsesModel(model="default", openai_client=client),
        model_settings=ModelSettings(temperature=0, max_tokens=12, truncation="auto"),
    )
    config = RunConfig(tracing_disabled=True)

    async def talk() -> list[int]:
        previous, sizes = None, []
        for topic in TOPICS:
            result = await Runner.run(
                agent, question(topic), previous_response_id=previous, run_config=config
            )
            previous = result.last_response_id
            usage = result.raw_responses[-1].usage
            sizes.append(usage.input_tokens if usage else 0)
        return sizes

    sizes = asyncio.run(talk())
    assert max(sizes) < WINDOW
    assert any(later < earlier for earlier, later in itertools.pairwise(sizes))


def test_truncation_values_other_than_auto_and_disabled_are_refused(small: ServerProcess) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        oai(small).responses.create(
            model="default", input="Hi", extra_body={"truncation": "sometimes"}
        )
    assert refused.value.body["param"] == "truncation"  # type: ignore[index]  # an error body


PAGE = {"type": "object", "properties": {"page": {"type": "integer"}}, "required": ["page"]}
CLEARING: Any = {
    "edits": [
        {
            "type": "clear_tool_uses_20250919",
            "trigger": {"type": "input_tokens", "value": 800},
            "keep": {"type": "tool_uses", "value": 1},
        }
    ]
}


def test_an_anthropic_tool_loop_past_the_window_clears_old_results_and_stays_cached(
    small: ServerProcess,
) -> None:
    client = anthropic.Anthropic(base_url=small.url, api_key="unused", max_retries=0)
    body: dict[str, Any] = {
        "model": "default",
        "max_tokens": 40,
        "system": "Read the book page by page with the read_page tool.",
        "tools": [{"name": "read_page", "description": "One page", "input_schema": PAGE}],
        "tool_choice": {"type": "tool", "name": "read_page", "disable_parallel_tool_use": True},
        "extra_body": {"temperature": 0},  # Anthropic samples at 1 by default
        "betas": ["context-management-2025-06-27"],
        "context_management": CLEARING,
    }
    history: list[Any] = [{"role": "user", "content": "Read the whole book."}]
    replies = []
    for page in range(9):
        reply = client.beta.messages.create(messages=history, **body)
        replies.append(reply)
        [call] = [b for b in reply.content if b.type == "tool_use"]
        history.append({"role": "assistant", "content": [b.model_dump() for b in reply.content]})
        text = f"Page {page}: " + " ".join(f"line {i} of the story goes on." for i in range(18))
        result = {"type": "tool_result", "tool_use_id": call.id, "content": text}
        history.append({"role": "user", "content": [result]})
    cleared = [cleared_uses(r) for r in replies]
    prompts = [r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) for r in replies]
    assert max(prompts) < WINDOW  # without the edit the last ones would not fit
    assert cleared == sorted(cleared)
    assert cleared[-1] > 0
    steps = [i for i in range(1, len(cleared) - 1) if cleared[i - 1] < cleared[i] == cleared[i + 1]]
    assert steps, cleared
    for step in steps:  # the turn after a clearing grows from it: cached
        kept = prompts[step] + replies[step].usage.output_tokens
        assert (replies[step + 1].usage.cache_read_input_tokens or 0) >= 0.9 * kept
    cold_equals_edited(small, body, history, replies, cleared)


def cleared_uses(reply: Any) -> int:
    edits = reply.context_management.applied_edits if reply.context_management else []
    return sum(edit.cleared_tool_uses for edit in edits)


def cold_equals_edited(
    server: ServerProcess,
    body: dict[str, Any],
    history: list[Any],
    replies: list[Any],
    cleared: list[int],
) -> None:
    """The last reply is what its edited history gives without the edit, cold (another
    tenant: nothing cached): its oldest results cleared as the edit says."""
    last = len(replies) - 1
    edited = copy.deepcopy(history[: 1 + 2 * last])
    results = [m for m in edited if m["role"] == "user" and isinstance(m["content"], list)]
    for message in results[: cleared[last]]:
        message["content"][0]["content"] = CLEARED_RESULT
    other = anthropic.Anthropic(
        base_url=server.url, api_key="unused", default_headers={"X-Namespace": "cold"}
    )
    plain = {k: v for k, v in body.items() if k not in ("betas", "context_management")}
    cold = other.messages.create(messages=edited, **plain)
    assert (cold.usage.cache_read_input_tokens or 0) == 0
    assert [(b.type, getattr(b, "input", None)) for b in cold.content] == [
        (b.type, getattr(b, "input", None)) for b in replies[last].content
    ]


def test_an_agents_context_policy_keeps_it_answering_past_the_window_and_cached(
    small: ServerProcess,
) -> None:
    api = f"{small.url}/v1/agents"
    policy = {"edit": "drop_oldest_turns", "trigger_tokens": 700, "keep": 3}
    made = httpx.post(api, json={"id": "reader", "system_prompt": INSTRUCTIONS, "context": policy})
    assert made.status_code == 201
    assert made.json()["context"] == policy
    usages = []
    for topic in TOPICS:
        sent = {"content": question(topic), "max_tokens": 12, "temperature": 0}
        reply = httpx.post(f"{api}/reader/messages", json=sent, timeout=120)
        assert reply.status_code == 200, reply.text
        usages.append(reply.json()["usage"])
    sizes = [u["prompt_tokens"] for u in usages]
    assert max(sizes) < WINDOW
    drops = [i for i in range(1, len(sizes) - 1) if sizes[i - 1] > sizes[i] < sizes[i + 1]]
    assert drops, sizes
    for drop in drops:  # the turn after a drop grows from it, cached
        kept = sizes[drop] + usages[drop]["completion_tokens"]
        assert usages[drop + 1]["cached_tokens"] >= 0.9 * kept, (sizes, usages)
    listed = httpx.get(f"{api}/reader/messages", params={"limit": 100}).json()["data"]
    assert len(listed) == 2 * len(TOPICS)  # the transcript keeps every turn


@pytest.mark.parametrize(
    "policy",
    [
        {"edit": "forget", "trigger_tokens": 700},
        {"edit": "drop_oldest_turns", "trigger_tokens": 100},
        {"edit": "drop_oldest_turns", "trigger_tokens": WINDOW},
        {"edit": "clear_tool_results", "trigger_tokens": 700, "keep": -1},
        {"edit": "drop_oldest_turns"},
    ],
)
def test_a_bad_context_policy_is_refused_by_name(small: ServerProcess, policy: Any) -> None:
    refused = httpx.post(f"{small.url}/v1/agents", json={"id": "bad", "context": policy})
    assert refused.status_code == 400, refused.text
    assert "context" in str(refused.json()["error"]["param"]), refused.text
    assert httpx.get(f"{small.url}/v1/agents/bad").status_code == 404


def test_truncation_keeps_the_turn_whose_call_the_input_answers(small: ServerProcess) -> None:
    """A chain of one turn (a question and its call) answered by a result too long to fit:
    the turn holding the call cannot go, so it is the input that does not fit."""
    client = oai(small)
    tool: Any = {"type": "function", "name": "read_page", "parameters": PAGE}
    first = client.responses.create(
        model="default",
        input="Read the book.",
        tools=[tool],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=40,
        temperature=0,
    )
    [call] = [item for item in first.output if item.type == "function_call"]
    result: Any = {
        "type": "function_call_output",
        "call_id": call.call_id,
        "output": "page " * 1100,
    }
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model="default",
            previous_response_id=first.id,
            input=[result],
            tools=[tool],
            truncation="auto",
            max_output_tokens=12,
        )
    assert refused.value.body["param"] == "input"  # type: ignore[index]  # an error body
    assert "answers no function_call" not in str(refused.value)


def test_an_anthropic_max_tokens_past_the_window_runs_to_its_end(small: ServerProcess) -> None:
    """Anthropic's ``max_tokens`` is a ceiling (its 4.5 models' rule; pydantic-ai sends
    16,384 to a model it does not know): lowered to the room the prompt leaves, and a
    reply that fills the window says so, plain and streamed."""
    client = anthropic.Anthropic(base_url=small.url, api_key="unused", max_retries=0)
    words = " ".join(f"w{i}" for i in range(100))

    def asked(pad: int) -> Any:
        return [{"role": "user", "content": f"Repeat these words: {words}{' x' * pad}"}]

    def count(pad: int) -> int:
        return client.messages.count_tokens(model="default", messages=asked(pad)).input_tokens

    bare, each = count(0), (count(100) - count(0)) // 100
    messages = asked((WINDOW - 3 - bare) // each)  # a few tokens of room left
    prompt = count((WINDOW - 3 - bare) // each)
    assert WINDOW - 8 < prompt < WINDOW
    ceiling: Any = {"model": "default", "max_tokens": 16_384, "extra_body": {"temperature": 0}}
    full = client.messages.create(messages=messages, **ceiling)
    used = full.usage  # Anthropic's input_tokens leave out what came from the cache
    assert used.input_tokens + (used.cache_read_input_tokens or 0) + used.output_tokens == WINDOW
    assert full.stop_reason == "model_context_window_exceeded"
    with client.messages.stream(messages=messages, **ceiling) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "model_context_window_exceeded"
    assert [b.model_dump(exclude={"parsed_output"}) for b in streamed.content] == [
        b.model_dump() for b in full.content
    ]
