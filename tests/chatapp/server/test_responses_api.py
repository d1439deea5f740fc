"""OpenAI's Responses API driven by the official `openai` client and the OpenAI Agents SDK's default path,
against a real server on the bundled model: text, function calls and the loop back, cached tokens, errors."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.chatapp.server.agent_support import weather_agent
from tests.server_support import SYSTEM_PROMPT, RunningServer

QUESTION = "Which lighthouse is the oldest?"
NEVER_ENDS = {"ignore_eos": True}  # the answer's length is the same on every CPU
WEATHER_TOOL: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather now in a city.",
    # A bounded string: the call ends within max_output_tokens whatever the model writes on this CPU.
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 24}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


def test_a_whole_response_and_a_streamed_one_agree_and_the_second_reuses_the_prompt(
    client: openai.OpenAI, server: RunningServer
) -> None:
    asked: dict[str, Any] = {
        "model": server.model_id,
        "instructions": SYSTEM_PROMPT + " (responses)",
        "input": QUESTION,
        "max_output_tokens": 12,
        "temperature": 0,
        "extra_body": NEVER_ENDS,
    }
    whole = client.responses.create(**asked)
    assert whole.status == "incomplete"
    assert whole.incomplete_details is not None
    assert whole.incomplete_details.reason == "max_output_tokens"
    assert whole.output_text
    assert whole.usage is not None
    assert whole.usage.output_tokens == 12
    events = list(client.responses.create(stream=True, **asked))
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created"
    assert kinds[-1] == "response.incomplete"
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert deltas == whole.output_text
    final = events[-1].response
    assert final.output_text == whole.output_text
    assert final.usage is not None
    assert final.usage.input_tokens == whole.usage.input_tokens
    assert final.usage.input_tokens_details.cached_tokens > whole.usage.input_tokens - 8


def test_a_function_call_and_its_output_sent_back_reuse_the_call(client: openai.OpenAI, server: RunningServer) -> None:
    items: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    asked: dict[str, Any] = {
        "model": server.model_id,
        "instructions": "You are a helpful assistant with tools (responses).",
        "tools": [WEATHER_TOOL],
        "max_output_tokens": 120,
        "temperature": 0,
    }
    first = client.responses.create(input=items, tool_choice="required", **asked)
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1
    call = calls[0]
    assert call.name == "get_weather"
    assert isinstance(json.loads(call.arguments)["city"], str)
    items += [item.model_dump(exclude_none=True) for item in first.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees and sunny"})
    server.serving.engine.flush_cache()  # the tool ran meanwhile: the call's tokens are in the KV
    second = client.responses.create(input=items, **asked)
    assert first.usage is not None
    assert second.usage is not None
    earlier = first.usage.input_tokens + first.usage.output_tokens - 1
    assert second.usage.input_tokens_details.cached_tokens >= earlier, "the first prompt and the call are reused"


def test_a_streamed_function_call_comes_as_it_is_written_and_is_the_one_completed(
    client: openai.OpenAI, server: RunningServer
) -> None:
    """Codex reads the call's item as it begins, its arguments in pieces, then the completed response."""
    events = list(
        client.responses.create(
            model=server.model_id,
            input="What is the weather in Oslo?",
            tools=[WEATHER_TOOL],
            tool_choice="required",
            max_output_tokens=120,
            temperature=0,
            stream=True,
        )
    )
    kinds = [event.type for event in events]
    added = next(event.item for event in events if event.type == "response.output_item.added")
    assert added.type == "function_call"
    assert added.name == "get_weather"
    pieces = [event.delta for event in events if event.type == "response.function_call_arguments.delta"]
    assert len(pieces) > 1, "the arguments come as they are written, not whole at the end"
    assert kinds.index("response.output_item.added") < kinds.index("response.function_call_arguments.delta")
    (done,) = [event.arguments for event in events if event.type == "response.function_call_arguments.done"]
    assert done == "".join(pieces)
    assert kinds[-1] == "response.completed"
    (call,) = [item for item in events[-1].response.output if item.type == "function_call"]
    assert (call.call_id, call.name, json.loads(call.arguments)) == (added.call_id, "get_weather", json.loads(done))


def test_a_json_schema_format_is_held(client: openai.OpenAI, server: RunningServer) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 40}, "year": {"type": "integer"}},
        "required": ["name", "year"],
        "additionalProperties": False,
    }
    answer = client.responses.create(
        model=server.model_id,
        input="Name a lighthouse and the year it was built.",
        text={"format": {"type": "json_schema", "name": "lighthouse", "schema": schema, "strict": True}},
        max_output_tokens=120,
        temperature=0,
    )
    value = json.loads(answer.output_text)
    assert set(value) == {"name", "year"}
    assert isinstance(value["year"], int)


def test_tools_this_server_cannot_run_are_left_out(client: openai.OpenAI, server: RunningServer) -> None:
    """Codex sends a hosted web search and a namespace of sub-agent tools beside its functions: only the
    functions are offered to the model (the prompt is the same as with them alone)."""
    hosted: Any = [
        {"type": "web_search", "external_web_access": False},
        {"type": "namespace", "name": "agents", "tools": []},
    ]
    asked: dict[str, Any] = {"model": server.model_id, "input": QUESTION, "max_output_tokens": 2, "temperature": 0}
    alone = client.responses.create(tools=[WEATHER_TOOL], **asked)
    beside = client.responses.create(tools=[*hosted, WEATHER_TOOL], **asked)
    assert alone.usage is not None
    assert beside.usage is not None
    assert beside.usage.input_tokens == alone.usage.input_tokens
    assert beside.usage.input_tokens_details.cached_tokens >= alone.usage.input_tokens - 2


def test_the_agents_sdks_default_path_runs_an_agent_with_a_function_tool(server: RunningServer) -> None:
    from agents import OpenAIResponsesModel, Runner
    from agents.items import ToolCallOutputItem

    # The tool's output is the final answer: no free text needed.
    agent, cities = weather_agent(server, OpenAIResponsesModel, max_tokens=120, tool_use_behavior="stop_on_first_tool")
    result = Runner.run_sync(agent, "What is the weather in Paris? Use the tool.", max_turns=2)
    assert len(cities) == 1, "the tool ran with the arguments the model gave"
    outputs = [item.output for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    assert outputs == [f"18 degrees and sunny in {cities[0]}"]
    assert result.final_output == outputs[0]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"input": "hi", "previous_response_id": "resp_1"}, "stateless"),
        ({"input": [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{oops"}]}, "not JSON"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "'input_image'"),
        ({"input": "hi", "tools": ["web_search"]}, "function tool"),
        ({"input": "hi", "conversation": "conv_1"}, "stateless"),
        ({"input": "hi", "background": True}, "within the request"),
        ({"input": "hi", "reasoning": {"effort": "maximal"}}, "reasoning.effort"),
    ],
    ids=[
        "previous-response",
        "arguments-not-json",
        "image",
        "tool-not-an-object",
        "conversation",
        "background",
        "effort",
    ],
)
def test_what_cannot_be_served_is_a_400_naming_it(server: RunningServer, body: dict[str, Any], words: str) -> None:
    answer = httpx.post(f"{server.url}/v1/responses", json={"model": server.model_id, **body}, timeout=60)
    assert answer.status_code == 400
    message = answer.json()["error"]["message"]
    assert words in message
    assert "\n" not in message
