"""Tool calls and structured output through the official clients, on the bundled model.

SmolLM2's template knows no tools: the server teaches the call format in the system prompt
and holds calls to it with a grammar, so even this model calls tools with valid arguments.
The agent loop (the call sent back, its result added) must stay a cache hit.
"""

from __future__ import annotations

import json
from typing import Any

import ollama
import openai
import pytest

from tests.chatapp.server.test_openai_api import cache_header
from tests.server_support import RunningServer

# Bounded strings: a call held to these schemas ends well within ANSWER_TOKENS, whatever the model would
# write on this CPU (an unbounded string could run past it and leave the call cut).
CITY = {"type": "string", "maxLength": 24}
ANSWER_TOKENS = 120
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather now in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": CITY, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a city.",
        "parameters": {"type": "object", "properties": {"city": CITY}, "required": ["city"]},
    },
}
QUESTION = [
    {"role": "system", "content": "You are a helpful assistant with tools."},
    {"role": "user", "content": "What is the weather in Paris?"},
]


def create(client: openai.OpenAI, server: RunningServer, messages: list[Any], **options: Any) -> Any:
    options = {"temperature": 0, "max_tokens": ANSWER_TOKENS, **options}
    raw = client.chat.completions.with_raw_response.create(model=server.model_id, messages=messages, **options)
    completion = raw.parse()
    completion.cache = cache_header(raw.headers)
    return completion


def test_a_required_call_names_a_tool_with_arguments_that_follow_its_schema(
    client: openai.OpenAI, server: RunningServer
) -> None:
    answer = create(client, server, QUESTION, tools=[WEATHER_TOOL, TIME_TOOL], tool_choice="required")
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls
    assert all(call.id.startswith("call_") for call in calls)
    for call in calls:
        arguments = json.loads(call.function.arguments)
        if call.function.name == "get_weather":
            assert set(arguments) == {"city", "unit"}
            assert arguments["unit"] in ("celsius", "fahrenheit")
        else:
            assert call.function.name == "get_time"
            assert set(arguments) >= {"city"}


def test_a_named_function_is_the_one_called_once(client: openai.OpenAI, server: RunningServer) -> None:
    choice = {"type": "function", "function": {"name": "get_time"}}
    answer = create(client, server, QUESTION, tools=[WEATHER_TOOL, TIME_TOOL], tool_choice=choice)
    calls = answer.choices[0].message.tool_calls
    assert [call.function.name for call in calls] == ["get_time"]
    assert isinstance(json.loads(calls[0].function.arguments)["city"], str)


def test_streamed_calls_join_to_the_whole_answer(client: openai.OpenAI, server: RunningServer) -> None:
    options: dict[str, Any] = {"tools": [WEATHER_TOOL, TIME_TOOL], "tool_choice": "required"}
    whole = create(client, server, QUESTION, **options).choices[0]
    stream = client.chat.completions.create(
        model=server.model_id, messages=QUESTION, temperature=0, max_tokens=ANSWER_TOKENS, stream=True, **options
    )
    content, calls, finish, pieces = "", {}, None, 0
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            if call.id:  # the first delta of a call carries its id and name
                assert call.function.name
                calls[call.index] = {"id": call.id, "name": call.function.name, "arguments": ""}
            calls[call.index]["arguments"] += call.function.arguments or ""
            pieces += bool(call.function.arguments)
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert content == ""
    assert pieces > len(calls), "the arguments come as they are written, not whole at the end"
    streamed = [(call["name"], json.loads(call["arguments"])) for call in calls.values()]
    assert streamed == [(call.function.name, json.loads(call.function.arguments)) for call in whole.message.tool_calls]


def test_the_agent_loop_reuses_everything_but_the_tool_result(client: openai.OpenAI, server: RunningServer) -> None:
    """The call comes back re-serialized by the client (content null): its generated tokens are found again."""
    messages: list[Any] = [
        {"role": "system", "content": "You are a helpful assistant with tools (agent loop)."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    tools = [WEATHER_TOOL, TIME_TOOL]
    first = create(client, server, messages, tools=tools, tool_choice="required")
    call = first.choices[0].message.tool_calls[0]
    resent = json.dumps(json.loads(call.function.arguments), indent=2)  # another spelling of the same arguments
    messages.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": resent}}
            ],
        }
    )
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"})
    server.serving.engine.flush_cache()  # the call's tokens are in the KV (the tool ran meanwhile)
    second = create(client, server, messages, tools=tools)
    earlier = first.usage.prompt_tokens + first.usage.completion_tokens - 1  # the last token is never evaluated
    assert int(second.cache["reused"]) >= earlier, "the first prompt and the call it generated are reused"
    new_tokens = second.usage.prompt_tokens - int(second.cache["reused"])
    assert new_tokens < 40, "only the tool result and the closing text are computed"
    assert second.usage.prompt_tokens_details.cached_tokens == int(second.cache["reused"])


def test_json_schema_output_follows_the_schema(client: openai.OpenAI, server: RunningServer) -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "year": {"type": "integer"},
            "kind": {"enum": ["fact", "myth"]},
        },
        "required": ["name", "year", "kind"],
        "additionalProperties": False,
    }
    answer = create(
        client,
        server,
        [{"role": "user", "content": "Name a lighthouse and the year it was built."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "lighthouse", "schema": schema, "strict": True},
        },
    )
    value = json.loads(answer.choices[0].message.content)
    assert set(value) == {"name", "year", "kind"}
    assert isinstance(value["name"], str)
    assert isinstance(value["year"], int)
    assert value["kind"] in ("fact", "myth")


def test_json_mode_gives_an_object(client: openai.OpenAI, server: RunningServer) -> None:
    answer = create(
        client,
        server,
        [{"role": "user", "content": "Return a JSON object with the keys city and country for Paris."}],
        response_format={"type": "json_object"},
    )
    assert answer.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(answer.choices[0].message.content), dict)


def test_a_grammar_costs_no_cache_hit(client: openai.OpenAI, server: RunningServer) -> None:
    """The same conversation with and without a response format: the prompt is the same, reused whole."""
    messages = [{"role": "user", "content": "Give me a colour as JSON, please (grammar and cache)."}]
    plain = create(client, server, messages)
    shaped = create(client, server, messages, response_format={"type": "json_object"})
    plain_again = create(client, server, messages)
    assert shaped.usage.prompt_tokens == plain.usage.prompt_tokens
    assert int(shaped.cache["reused"]) == int(plain_again.cache["reused"]) > plain.usage.prompt_tokens // 2


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}},
                    },
                }
            },
            "minimum",
        ),
        ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "object", "not": {}}},
                }
            },
            "'not'",
        ),
        ({"response_format": {"type": "yaml"}}, "yaml"),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(
    client: openai.OpenAI, server: RunningServer, options: dict[str, Any], named: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        create(client, server, QUESTION, **options)
    assert named in str(refused.value)


def test_a_tools_keywords_a_grammar_cannot_hold_are_left_to_the_client(
    client: openai.OpenAI, server: RunningServer
) -> None:
    """Agents bound their tools' numbers (Claude Code's Read has `minimum`): the grammar holds the rest of the
    schema and the client checks a call before it runs it, where a response format is refused by name."""
    bounded = {
        "type": "function",
        "function": {
            "name": "read_lines",
            "parameters": {
                "type": "object",
                "properties": {
                    "offset": {"type": "integer", "minimum": 1, "maximum": 9999},
                    "path": {"type": "string", "maxLength": 24, "format": "uri"},
                },
                "required": ["offset", "path"],
                "additionalProperties": False,
            },
        },
    }
    answer = create(client, server, QUESTION, tools=[bounded], tool_choice="required")
    (call,) = answer.choices[0].message.tool_calls
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"offset", "path"}
    assert isinstance(arguments["offset"], int)
    assert isinstance(arguments["path"], str)


def test_ollama_tools_and_format(server: RunningServer) -> None:
    client = ollama.Client(host=server.url)
    answer = client.chat(
        model=server.model_id,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER_TOOL],
        options={"temperature": 0, "num_predict": ANSWER_TOKENS},
        format={"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    )
    if answer.message.tool_calls:  # with tools beside a format, the answer is a call or that JSON
        (call,) = answer.message.tool_calls
        assert call.function.name == "get_weather"
        assert "city" in call.function.arguments
        assert answer.message.content == ""
    else:
        assert json.loads(answer.message.content or "") in ({"ok": True}, {"ok": False})
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}],
        },
        {"role": "tool", "content": "18 degrees", "tool_name": "get_weather"},
    ]
    after = client.chat(
        model=server.model_id, messages=messages, tools=[WEATHER_TOOL], options={"temperature": 0, "num_predict": 20}
    )
    assert after.message.role == "assistant"
    assert after.done


def test_sorted_tools_keep_a_reordering_client_on_its_prefix(client: openai.OpenAI, server: RunningServer) -> None:
    """`chatapp serve --sort-tools`: the same tools in another order build the same prompt."""
    messages = [{"role": "system", "content": "You sort things (tool order)."}, {"role": "user", "content": "Hi"}]
    forward, backward = [WEATHER_TOOL, TIME_TOOL], [TIME_TOOL, WEATHER_TOOL]
    create(client, server, messages, tools=forward, max_tokens=2)
    unsorted = create(client, server, messages, tools=backward, max_tokens=2)
    server.serving.sort_tools = True
    try:
        create(client, server, messages, tools=forward, max_tokens=2)
        reordered = create(client, server, messages, tools=backward, max_tokens=2)
        again = create(client, server, messages, tools=forward, max_tokens=2)
    finally:
        server.serving.sort_tools = False
    assert int(reordered.cache["reused"]) == int(again.cache["reused"]) > int(unsorted.cache["reused"])


@pytest.mark.parametrize(
    ("date", "tools", "place"),
    [
        ("2026-12-01", [WEATHER_TOOL, TIME_TOOL], "the tools"),
        ("2026-12-02", [WEATHER_TOOL], "line 2 of the system prompt"),
    ],
)
def test_the_divergence_header_names_what_changed(
    client: openai.OpenAI, server: RunningServer, date: str, tools: list[Any], place: str
) -> None:
    """An agent's usual culprits: its tool list, or a line of its system prompt (a date, a file tree)."""

    def system(day: str) -> dict[str, str]:
        return {"role": "system", "content": f"You are an agent ({place}).\nToday is {day}.\nBe brief."}

    question = {"role": "user", "content": "Which day is it?"}
    create(client, server, [system("2026-12-01"), question], tools=[WEATHER_TOOL], max_tokens=2)
    raw = client.chat.completions.with_raw_response.create(
        model=server.model_id, messages=[system(date), question], tools=tools, max_tokens=2, temperature=0
    )
    assert json.loads(raw.headers["x-chatapp-cache-divergence"])["place"] == place
