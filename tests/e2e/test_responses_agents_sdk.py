"""The OpenAI Agents SDK with its default Responses model, pointed at this server: a
multi-turn agent chained on ``previous_response_id``, and an agent that calls a function
tool (constrained decoding makes the small model's call valid)."""

from __future__ import annotations

import asyncio

import openai
import pytest
from agents import Agent, ModelSettings, OpenAIResponsesModel, RunConfig, Runner, function_tool
from pydantic import BaseModel, Field
from reliability.server import ServerProcess

pytestmark = pytest.mark.model


def _model(server: ServerProcess) -> OpenAIResponsesModel:
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    return OpenAIResponsesModel(model="default", openai_client=client)


class Answer(BaseModel):
    """A final output whose schema the reply is generated under: it ends within the budget."""

    answer: str = Field(max_length=24)


SETTINGS = ModelSettings(temperature=0, max_tokens=64)
CONFIG = RunConfig(tracing_disabled=True)


def test_a_multi_turn_agent_chains_on_previous_response_id(server: ServerProcess) -> None:
    agent = Agent(
        name="helper",
        instructions="Answer in one short sentence.",
        model=_model(server),
        model_settings=SETTINGS,
        output_type=Answer,
    )

    async def talk() -> tuple[str, str, int]:
        first = await Runner.run(agent, "Name a planet.", run_config=CONFIG)
        second = await Runner.run(
            agent,
            "How big is it?",
            previous_response_id=first.last_response_id,
            run_config=CONFIG,
        )
        usage = second.raw_responses[-1].usage
        cached = usage.input_tokens_details.cached_tokens if usage else 0
        assert first.last_response_id is not None
        return first.last_response_id, str(second.final_output), cached

    first_id, answer, cached = asyncio.run(talk())
    assert answer.startswith("answer=")
    assert cached > 0  # the second turn resumed from the first's blocks
    stored = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused").responses.retrieve(
        first_id
    )
    assert stored.status in ("completed", "incomplete")


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"It is sunny in {city}."


def test_an_agent_calls_a_function_tool(server: ServerProcess) -> None:
    agent = Agent(
        name="forecaster",
        instructions="Use the weather tool to answer.",
        model=_model(server),
        model_settings=ModelSettings(
            temperature=0, max_tokens=40, tool_choice="required", parallel_tool_calls=False
        ),  # one call: this model repeats it in parallel, past 40 tokens (a limit: incomplete)
        tools=[weather],
        tool_use_behavior="stop_on_first_tool",
    )
    result = asyncio.run(Runner.run(agent, "What is the weather in Paris?", run_config=CONFIG))
    assert str(result.final_output).startswith("It is sunny in")
    calls = [i for i in result.new_items if i.type == "tool_call_item"]
    assert calls
