"""The OpenAI Agents SDK set up as its users do, against a real server: an agent with one weather tool."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.server_support import RunningServer


def get_weather(city: str) -> str:
    """The weather now in a city."""
    return f"18 degrees and sunny in {city}"


def weather_agent(
    server: RunningServer, model_class: Callable[..., Any], *, max_tokens: int, **options: Any
) -> tuple[Any, list[str]]:
    """An agent that must call its weather tool, asking `server` through `model_class` (the SDK's
    OpenAIChatCompletionsModel or OpenAIResponsesModel), and the cities the tool is called with."""
    from agents import Agent, ModelSettings, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    cities: list[str] = []

    @function_tool
    def weather(city: str) -> str:
        """The weather now in a city."""
        cities.append(city)
        return get_weather(city)

    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    agent = Agent(
        name="weather",
        instructions="You answer questions about the weather with the weather tool.",
        model=model_class(model=server.model_id, openai_client=client),
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=max_tokens),
        tools=[weather],
        **options,
    )
    return agent, cities
