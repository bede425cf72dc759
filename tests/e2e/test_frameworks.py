"""Agent frameworks as their docs point them at an OpenAI-compatible server: LangChain,
LangGraph, pydantic-ai, smolagents and AutoGen, each naming its agent in ``X-Agent-Id``
through its own client settings. (The OpenAI Agents SDK has its own tests; CrewAI pins an
``openai`` older than the SDK these tests need, so it is not installed beside them.)

What is held: each framework reads the replies it is given (calls, text, usage, a
structured output) and runs its loop to its end, and an agent that comes back finds its
conversation cached. The model is the embedded 135M one: its choices are not judged."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
from pydantic import BaseModel, Field
from reliability.server import ServerProcess

pytestmark = pytest.mark.model


def headers(agent: str) -> dict[str, str]:
    return {"X-Agent-Id": agent}


def langchain_model(server: ServerProcess, agent: str, max_tokens: int) -> Any:
    from langchain_openai import ChatOpenAI
    from pydantic import SecretStr

    return ChatOpenAI(
        base_url=f"{server.url}/v1",
        api_key=SecretStr("unused"),
        model="default",
        temperature=0,
        max_completion_tokens=max_tokens,
        default_headers=headers(agent),
    )


def test_langchain_binds_tools_and_returns_structured_output(server: ServerProcess) -> None:
    llm = langchain_model(server, "chain-1", 120)

    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "Sunny"

    message = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(
        "What is the weather in Paris?"
    )
    [call] = message.tool_calls
    assert call["name"] == "get_weather"
    assert isinstance(call["args"]["city"], str)

    class Person(BaseModel):
        name: str = Field(max_length=30)
        age: int = Field(ge=0, le=150)

    person = llm.with_structured_output(Person).invoke("Ann is 31 years old.")
    assert isinstance(person, Person)


class Forecast(BaseModel):
    city: str = Field(max_length=30)
    sunny: bool


def test_pydantic_ai_runs_its_tools_and_output_and_comes_back_cached(
    server: ServerProcess,
) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    client = openai.AsyncOpenAI(
        base_url=f"{server.url}/v1", api_key="unused", default_headers=headers("pyd-1")
    )
    model = OpenAIChatModel("default", provider=OpenAIProvider(openai_client=client))

    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"Sunny in {city}"

    agent = Agent(
        model,
        tools=[get_weather],
        output_type=Forecast,  # asked for through its own tool: the reply must call one
        instructions="Use get_weather, then give the forecast.",
        model_settings={"max_tokens": 80, "temperature": 0},
    )
    first = agent.run_sync("Is it sunny in Paris?")
    assert isinstance(first.output, Forecast)
    again = agent.run_sync("And in Rome?", message_history=first.all_messages())
    assert isinstance(again.output, Forecast)
    assert again.usage.cache_read_tokens > 0  # the agent's earlier turns, restored


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")  # `langchain` unneeded
def test_langgraph_react_agent_keeps_its_thread_cached(server: ServerProcess) -> None:
    from langchain_core.messages import AIMessage
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.prebuilt import create_react_agent

    llm = langchain_model(server, "graph-1", 60)

    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"Sunny in {city}"

    agent: Any = create_react_agent(llm, [get_weather], checkpointer=InMemorySaver())
    thread = {"configurable": {"thread_id": "t1"}, "recursion_limit": 8}
    agent.invoke({"messages": [("user", "Hello! Who are you?")]}, thread)
    second = agent.invoke({"messages": [("user", "What can you do?")]}, thread)
    last = second["messages"][-1]
    assert isinstance(last, AIMessage)
    assert last.content
    assert last.usage_metadata is not None
    details = last.usage_metadata.get("input_token_details") or {}
    assert details.get("cache_read", 0) > 0  # the thread's first turn, restored


def test_smolagents_tool_calling_agent_runs_its_tools_to_an_answer(
    server: ServerProcess,
) -> None:
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    asked: list[str] = []

    @tool  # type: ignore[untyped-decorator]  # smolagents ships no types
    def get_weather(city: str) -> str:
        """The weather in a city.

        Args:
            city: the city's name.
        """
        asked.append(city)
        return f"Sunny in {city}"

    model = OpenAIServerModel(
        model_id="default",
        api_base=f"{server.url}/v1",
        api_key="unused",
        client_kwargs={"default_headers": headers("smol-1"), "max_retries": 0},
        max_tokens=80,
        temperature=0,
    )
    agent = ToolCallingAgent(tools=[get_weather], model=model, max_steps=3, verbosity_level=0)
    answer = agent.run("What is the weather in Paris?")
    assert asked  # its calls parsed and run (smolagents asks with tool_choice required)
    assert str(answer)


@pytest.mark.filterwarnings("ignore:Resolved model mismatch")  # we answer the model's own name
def test_autogen_assistant_agent_answers_through_its_client(server: ServerProcess) -> None:
    from autogen_agentchat.agents import AssistantAgent
    from autogen_agentchat.messages import TextMessage
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    client = OpenAIChatCompletionClient(
        model="default",
        base_url=f"{server.url}/v1",
        api_key="unused",
        default_headers=headers("autogen-1"),
        max_tokens=60,
        temperature=0,
        model_info={
            "vision": False,
            "function_calling": True,
            "json_output": True,
            "family": "unknown",
            "structured_output": True,
        },
    )

    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"Sunny in {city}"

    agent = AssistantAgent("forecaster", model_client=client, tools=[get_weather])
    result = asyncio.run(agent.run(task="Hello! Who are you?"))
    reply = result.messages[-1]
    assert isinstance(reply, TextMessage)
    assert reply.content
    assert reply.models_usage is not None
    assert reply.models_usage.prompt_tokens > 0
