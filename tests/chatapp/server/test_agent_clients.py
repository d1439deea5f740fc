"""Agent frameworks as their users set them up, against a real server on the bundled model.

LangChain, the OpenAI Agents SDK and smolagents send tools, tool choices and response formats
with their own defaults (strict schemas, re-serialized arguments, stop strings); each must get
calls it can run and structured answers it can parse, and the loop must stay a cache hit.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from tests.chatapp.server.agent_support import get_weather, weather_agent
from tests.model_factory import copy_with_chat_template
from tests.server_support import RunningServer, running_server

TEMPLATES = Path(__file__).parents[1] / "prompting" / "templates"

pytestmark = pytest.mark.slow
WEATHER_QUESTION = "What is the weather in Paris? Use the tool."
# Room for a whole call or object however long this CPU's greedy strings run (the frameworks' schemas
# leave strings unbounded): a cut call would fail the test for a reason that is not the server's.
ANSWER_TOKENS = 120


@pytest.fixture(scope="module", params=["bundled", "bundled-qwen3-style"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, model_path: Path
) -> Iterator[RunningServer]:
    """The bundled model (its template has no tools: the format is taught), and the same weights
    with a Qwen3-style template (tools in the template's own format, written by the tests); a
    context that holds smolagents' own system prompt (1,200 tokens with one tool)."""
    if request.param != "bundled":
        template = (TEMPLATES / "qwen3_style.jinja").read_text()
        target = tmp_path_factory.mktemp("qwen") / "SmolLM2-qwen3-style.gguf"
        model_path = copy_with_chat_template(model_path, target, template)
    with running_server(tmp_path_factory.mktemp("agents-data"), model_path, context_cap=4096) as running:
        yield running


class City(BaseModel):
    """A city and its country."""

    city: str
    country: str


def chat_model(server: RunningServer, **options: Any) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        base_url=f"{server.url}/v1",
        api_key="unused",
        model=server.model_id,
        temperature=0,
        max_tokens=ANSWER_TOKENS,
        **options,
    )


def test_langchain_bind_tools_runs_the_loop_as_a_cache_hit(server: RunningServer) -> None:
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool

    weather = tool(get_weather)
    model = chat_model(server).bind_tools([weather], tool_choice="any")  # "any": LangChain's word for required
    messages: list[Any] = [SystemMessage("You answer with tools (LangChain)."), HumanMessage(WEATHER_QUESTION)]
    first = model.invoke(messages)
    assert [call["name"] for call in first.tool_calls] == ["get_weather"]
    assert isinstance(first.tool_calls[0]["args"]["city"], str)
    messages += [
        first,
        ToolMessage(weather.invoke(first.tool_calls[0]["args"]), tool_call_id=first.tool_calls[0]["id"]),
    ]
    server.serving.engine.flush_cache()  # the tool ran meanwhile: the call's tokens are in the KV
    second = chat_model(server).bind_tools([weather]).invoke(messages)
    usage = first.response_metadata["token_usage"]
    cached = second.response_metadata["token_usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= usage["prompt_tokens"] + usage["completion_tokens"] - 1
    assert isinstance(second.content, str)


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_langchain_structured_output(server: RunningServer, method: str) -> None:
    model = chat_model(server).with_structured_output(City, method=method)
    answer = model.invoke("Return a JSON object with the keys city and country for Paris.")
    if method == "json_mode":  # a JSON object, not held to the schema: LangChain parses what it can
        assert isinstance(answer, (City, dict))
    else:
        assert isinstance(answer, City)
        assert answer.city
        assert answer.country


def test_an_agents_sdk_agent_calls_a_function_tool_and_uses_its_result(server: RunningServer) -> None:
    from agents import OpenAIChatCompletionsModel, Runner
    from agents.items import MessageOutputItem, ToolCallOutputItem

    agent, cities = weather_agent(server, OpenAIChatCompletionsModel, max_tokens=ANSWER_TOKENS)
    result = Runner.run_sync(agent, WEATHER_QUESTION, max_turns=3)
    assert len(cities) >= 1, "the tool ran with the arguments the model gave"
    outputs = [item.output for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    assert outputs[0] == get_weather(cities[0])
    assert any(isinstance(item, MessageOutputItem) for item in result.new_items), "an answer after the result"
    assert isinstance(result.final_output, str)


def test_a_smolagents_tool_calling_agent_step(server: RunningServer) -> None:
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    asked: list[str] = []

    @tool  # type: ignore[untyped-decorator]
    def weather(city: str) -> str:
        """The weather now in a city.

        Args:
            city: The city's name.
        """
        asked.append(city)
        return get_weather(city)

    model = OpenAIServerModel(
        model_id=server.model_id, api_base=f"{server.url}/v1", api_key="unused", temperature=0, max_tokens=ANSWER_TOKENS
    )
    agent = ToolCallingAgent(tools=[weather], model=model, max_steps=1, verbosity_level=0)
    agent.run(WEATHER_QUESTION)
    steps = [step for step in agent.memory.steps if getattr(step, "tool_calls", None)]
    assert steps, "the first step made a call smolagents could read"
    call = steps[0].tool_calls[0]
    assert call.name in ("weather", "final_answer")
    if call.name == "weather":  # smolagents ran the tool with the arguments the grammar held
        assert asked == [call.arguments["city"]]
        assert isinstance(asked[0], str)


def test_the_format_is_the_templates_own_or_taught(server: RunningServer) -> None:
    from chatapp.tools import ToolSpec

    builder = server.serving.engine.prompt_builder
    assert builder is not None
    offered = builder.with_tools((ToolSpec("get_weather"),))
    assert offered.native_tools == server.model.id.endswith("qwen3-style")
