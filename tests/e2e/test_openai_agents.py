"""OpenAI's Agents SDK against Roundhouse: an agent calls a tool, reads its result and ends,
over Chat Completions and over the Responses API.

The agent is forced to call its tool first (`tool_choice: "required"`); the SDK then resets the
choice, so the next turn, with the tool's result in the history, is the model's own: the
trained demo model answers it in a sentence, which ends the run.
"""

from __future__ import annotations

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from tests.conftest import ALIAS


@pytest.fixture(params=["chat_completions", "responses"])
def model(request, stack, world) -> OpenAIChatCompletionsModel | OpenAIResponsesModel:
    set_tracing_disabled(True)  # nothing leaves the machine
    client = AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=world.acme_key, max_retries=0)
    if request.param == "responses":
        return OpenAIResponsesModel(model=ALIAS, openai_client=client)
    return OpenAIChatCompletionsModel(model=ALIAS, openai_client=client)


def test_an_agent_runs_a_tool_and_ends_its_run(model):
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Return the weather in a city."""
        asked.append(city)
        return f"Sunny in {city}, 21 degrees."

    agent = Agent(
        name="weather",
        instructions="You answer questions about the weather.",
        model=model,
        tools=[get_weather],
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=64),
    )
    result = Runner.run_sync(agent, "What's the weather in Paris?", max_turns=4)
    assert len(asked) == 1 and asked[0]  # the tool ran once, with a city
    assert isinstance(result.final_output, str) and result.final_output.strip()
    assert len(result.raw_responses) == 2  # the call, then the answer that ended the run
