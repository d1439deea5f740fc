"""Mistral's tool calls through the official clients: a tiny model with Mistral's markers as special tokens
and Mistral's own templates (Nemo's JSON list with ids, Small 3.2's `[TOOL_CALLS]f[CALL_ID]id[ARGS]`).

The calls come back with ids the template takes (the model's own where it wrote one), the agent
loop stays a cache hit, and an Ollama client, whose calls and results carry no ids, is served too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ollama
import openai
import pytest

from chatapp.prompting.tool_mistral import MISTRAL_ARGS_WITH_IDS
from chatapp.server.llama_api import LlamaCompletionBody
from chatapp.server.tool_fields import chat_message, tool_specs
from tests.chatapp.server.test_tool_calls import WEATHER_TOOL, create
from tests.model_factory import MISTRAL_SPECIAL_TOKENS, write_tiny_llama
from tests.server_support import RunningServer, running_server

TEMPLATES = Path(__file__).parents[1] / "prompting" / "templates"
NINE_ALNUM = re.compile(r"[a-zA-Z0-9]{9}")
# test_tool_calls.py's tool with a short city: a tiny model's text runs on to the token limit otherwise.
SHORT_WEATHER_TOOL: dict[str, Any] = json.loads(json.dumps(WEATHER_TOOL))
SHORT_WEATHER_TOOL["function"]["parameters"]["properties"]["city"]["maxLength"] = 16


@pytest.fixture(scope="module", params=["mistral_nemo", "mistral_small_3_2"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    template = (TEMPLATES / f"{request.param}.jinja").read_text()
    path = tmp_path_factory.mktemp("mistral") / f"tiny-{request.param}.gguf"
    write_tiny_llama(path, chat_template=template, special_tokens=MISTRAL_SPECIAL_TOKENS)
    with running_server(tmp_path_factory.mktemp("mistral-data"), path) as running:
        yield running


def test_the_agent_loop_with_mistral_ids_is_a_cache_hit(client: openai.OpenAI, server: RunningServer) -> None:
    messages: list[Any] = [
        {"role": "system", "content": "You are a helpful assistant with tools."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    first = create(client, server, messages, tools=[SHORT_WEATHER_TOOL], tool_choice="required")
    assert first.choices[0].finish_reason == "tool_calls"
    (call,) = first.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert NINE_ALNUM.fullmatch(call.id), "an id Mistral's templates take"
    resent = json.dumps(json.loads(call.function.arguments), indent=2)  # another spelling of the same arguments
    messages.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": "get_weather", "arguments": resent}}
            ],
        }
    )
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"})
    server.serving.engine.flush_cache()
    second = create(client, server, messages, tools=[SHORT_WEATHER_TOOL])
    earlier = first.usage.prompt_tokens + first.usage.completion_tokens - 1  # the last token is never evaluated
    assert int(second.cache["reused"]) >= earlier, "the first prompt and the call it generated are reused"
    assert second.usage.prompt_tokens - int(second.cache["reused"]) < 30, "only the result is computed"


def test_ollama_calls_and_results_without_ids(server: RunningServer) -> None:
    """Ollama's calls and results carry no ids, which Mistral's templates refuse: the call gets one they take,
    and the result the same one (the first call of its name not answered yet)."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": WEATHER_CALL}, {"function": WEATHER_CALL}]},
        {"role": "tool", "content": "18 degrees", "tool_name": "get_weather"},
        {"role": "tool", "content": "19 degrees", "tool_name": "get_weather"},
    ]
    client = ollama.Client(host=server.url)
    options = {"temperature": 0, "num_predict": 8}
    after = client.chat(model=server.model_id, messages=messages, tools=[SHORT_WEATHER_TOOL], options=options)
    assert after.message.role == "assistant"
    assert after.done
    api_messages = tuple(
        chat_message(index, message["role"], message["content"], message, {}) for index, message in enumerate(messages)
    )
    history = server.serving.completions.chat_messages(api_messages)
    calls, results = history[1].tool_calls, history[2].results
    assert [result.call_id for result in results] == [call.id for call in calls]
    builder = server.engine.prompt_builder
    assert builder is not None
    tools = builder.with_tools(tool_specs([SHORT_WEATHER_TOOL]))
    text = server.engine.model.detokenize(tools.build(history), special=True)
    for call in calls:
        shown_id = tools.tool_format.call_ids.for_template(call.id)
        assert NINE_ALNUM.fullmatch(shown_id)
        assert text.count(shown_id) == 2, "the call and its result name the same id"


WEATHER_CALL = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}


def test_the_grammar_crosses_to_a_backend_with_its_markers() -> None:
    """In front of llama-server or another chatapp serve, the markers to show go with the grammar
    (llama-server's `preserved_tokens`), and a chatapp backend takes them."""
    grammar = MISTRAL_ARGS_WITH_IDS.grammar(tool_specs([SHORT_WEATHER_TOOL]), parallel=False, lazy=True)
    fields = grammar.server_fields()
    assert fields["preserved_tokens"] == ["[TOOL_CALLS]", "[CALL_ID]", "[ARGS]"]
    received = LlamaCompletionBody(prompt=[1, 2], **fields).answer_grammar()
    assert received is not None
    assert received.preserved == grammar.preserved
    assert received.trigger_patterns() == grammar.trigger_patterns()
