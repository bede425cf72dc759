"""The plain front doors' chat turn, on fakes: refusals named by the request's own field,
hints kept only once a request has started, and a prefill's reply left free."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from semantic.application.chat.call_memory import CallMemory
from semantic.application.chat.chat_turn import ChatAsk, ChatTurns
from semantic.application.chat.generation import GenerationHandle, GenerationInput, Limits
from semantic.application.chat.message_threads import MessageThreads
from semantic.domain.chat import ChatMessage
from semantic.domain.errors import InvalidRequestError, PromptTooLongError
from semantic.domain.retention import Retention
from semantic.domain.tools import Tool, ToolChoice, ToolUse
from tests.unit.fakes import FakeTokenizer
from tests.unit.storage_fakes import FakeMetadataStore, FakeObjectStore

TOOL = Tool("get_time", "", '{"type": "object", "properties": {}}')
LIMITS = Limits(max_context=64, max_tokens_cap=16, default_max_tokens=8)


class ToolsTokenizer(FakeTokenizer):
    """Each listed tool takes 20 tokens of the prompt."""

    def render_chat(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[Tool] = (), **_: Any
    ) -> list[int]:
        return super().render_chat(messages) + [1] * 20 * len(tools)


class FakeHandle:
    request_id = "req-1"
    prompt_tokens = 3
    cached_tokens = 0

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class FakeAgents:
    def __init__(self, refusal: Exception | None = None) -> None:
        self.refusal = refusal
        self.started: list[GenerationInput] = []
        self.handles: list[FakeHandle] = []
        self.retained: list[Mapping[str, Any]] = []
        self.retain_fails = False

    async def start_plain(self, request: GenerationInput) -> GenerationHandle:
        if self.refusal is not None:
            raise self.refusal
        self.started.append(request)
        self.handles.append(FakeHandle())
        return self.handles[-1]  # type: ignore[return-value]  # what the turn uses of one

    async def retain(
        self, namespace: str, agent_id: str, change: Mapping[str, Any], *, known: bool = False
    ) -> Retention:
        if self.retain_fails:
            raise InvalidRequestError("the agent keeps a transcript", param="X-Agent-Id")
        self.retained.append(change)
        return Retention()


def turns(agents: FakeAgents) -> ChatTurns:
    threads = MessageThreads(FakeObjectStore())
    return ChatTurns(agents, ToolsTokenizer(), CallMemory(FakeMetadataStore()), LIMITS, threads)


def ask(**fields: Any) -> ChatAsk:
    return ChatAsk("default", **{"messages": (ChatMessage("user", "bcd"),), **fields})


async def test_a_completions_refusals_name_its_prompt() -> None:
    agents = FakeAgents(InvalidRequestError("the prompt is empty", param="messages"))
    with pytest.raises(InvalidRequestError) as refused:
        await turns(agents).start(ask(messages=(), prompt=(1, 2)))
    assert refused.value.param == "prompt"
    with pytest.raises(InvalidRequestError) as empty:
        await turns(FakeAgents()).start(ask(messages=(), prompt=""))
    assert empty.value.param == "prompt"


async def test_a_prompt_that_fits_only_without_its_tools_names_the_tools() -> None:
    agents = FakeAgents(PromptTooLongError("the prompt is too long", param="messages"))
    tools = ToolUse((TOOL,), ToolChoice.AUTO)
    with pytest.raises(PromptTooLongError) as with_tools:
        await turns(agents).start(ask(tools=tools))
    assert with_tools.value.param == "tools"
    with pytest.raises(PromptTooLongError) as bare:
        await turns(agents).start(ask())
    assert bare.value.param == "messages"


async def test_hints_are_kept_once_started_and_a_request_whose_hints_fail_ends() -> None:
    hints = {"ttl_seconds": 60}
    refused = FakeAgents(PromptTooLongError("too long", param="messages"))
    with pytest.raises(PromptTooLongError):
        await turns(refused).start(ask(agent_id="a1", retention=hints))
    assert refused.retained == []  # a refused request changes no hints
    agents = FakeAgents()
    await turns(agents).start(ask(agent_id="a1", retention=hints))
    assert agents.retained == [hints]
    agents.retain_fails = True
    with pytest.raises(InvalidRequestError):
        await turns(agents).start(ask(agent_id="a1", retention=hints))
    assert agents.handles[-1].closed


async def test_a_prefill_leaves_the_reply_free_and_tools_shape_it_otherwise() -> None:
    agents = FakeAgents()
    tools = ToolUse((TOOL,), ToolChoice.REQUIRED)
    free = await turns(agents).start(ask(tools=tools, continue_final=True))
    shaped = await turns(agents).start(ask(tools=tools))
    assert [request.constraint is None for request in agents.started] == [True, False]
    assert (free.reads_calls, shaped.reads_calls) == (False, True)


async def test_a_lowered_max_tokens_runs_with_what_the_server_gives() -> None:
    """Anthropic's ``max_tokens`` is a ceiling: lowered to the cap and to the room the
    prompt leaves; other front doors' run as asked (and are refused past either)."""
    agents = FakeAgents()
    await turns(agents).start(ask(max_tokens=16_384, max_tokens_lowered=True))
    await turns(agents).start(ask(max_tokens=4, max_tokens_lowered=True))
    tools = ToolUse((TOOL, TOOL, TOOL), ToolChoice.AUTO)  # 60 more tokens of prompt
    await turns(agents).start(ask(max_tokens=16_384, max_tokens_lowered=True, tools=tools))
    await turns(agents).start(ask(max_tokens=16_384))
    prompts = [len(request.prompt_tokens) for request in agents.started]
    room = LIMITS.max_context - prompts[2]
    assert 0 < room < LIMITS.max_tokens_cap
    assert [request.max_tokens for request in agents.started] == [16, 4, room, 16_384]
