"""Each agent client as its users set it up, against chatapp serve on the bundled model: the share of
each request's prompt tokens the cache gave, as the server counted it.

Every client runs a short agent loop (a question, a tool call, its result, an answer, a second
question); the server's own figures for each request are collected. The tool, and the user
between questions, take the time the engine needs to compute the last answer's tokens as a
prompt (`flush_cache`), as a real tool or a typing user does; back to back, the next request
would compute them itself. Run from the repository root:

    .venv/bin/python tools/agent_clients_reuse.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chatapp.model_files import bundled_model_path
from tests.server_support import RunningServer, running_server

SYSTEM = "You are a helpful assistant who uses tools to answer questions about the weather. " * 8
QUESTIONS = ["What is the weather in Paris? Use the tool.", "And in Rome? Use the tool."]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather now in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def meanwhile() -> None:
    """What happens between two requests (set to the server's flush)."""


def get_weather(city: str) -> str:
    """The weather now in a city.

    Args:
        city: The city's name.
    """
    meanwhile()
    return f"18 degrees and sunny in {city}"


def run_openai(server: RunningServer) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    messages: list[Any] = [{"role": "system", "content": SYSTEM}]
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        first = client.chat.completions.create(
            model=server.model_id, messages=messages, tools=[WEATHER], tool_choice="required", max_tokens=60
        )
        calls = first.choices[0].message.tool_calls or []
        messages.append({"role": "assistant", "content": None, "tool_calls": [call.model_dump() for call in calls]})
        messages += [{"role": "tool", "tool_call_id": call.id, "content": get_weather("Paris")} for call in calls]
        answer = client.chat.completions.create(
            model=server.model_id, messages=messages, tools=[WEATHER], max_tokens=30
        )
        messages.append({"role": "assistant", "content": answer.choices[0].message.content})
        meanwhile()


def run_langchain(server: RunningServer) -> None:
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    weather = tool(get_weather)
    model = ChatOpenAI(base_url=f"{server.url}/v1", api_key="unused", model=server.model_id, max_tokens=60)
    messages: list[Any] = [SystemMessage(SYSTEM)]
    for question in QUESTIONS:
        messages.append(HumanMessage(question))
        called = model.bind_tools([weather], tool_choice="any").invoke(messages)
        messages.append(called)
        messages += [ToolMessage(weather.invoke(call["args"]), tool_call_id=call["id"]) for call in called.tool_calls]
        messages.append(model.bind_tools([weather]).invoke(messages))
        meanwhile()


def run_agents_sdk(server: RunningServer) -> None:
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused")
    agent = Agent(
        name="weather",
        instructions=SYSTEM,
        model=OpenAIChatCompletionsModel(model=server.model_id, openai_client=client),
        model_settings=ModelSettings(tool_choice="required", max_tokens=60),
        tools=[function_tool(get_weather)],
    )
    history: list[Any] = []
    for question in QUESTIONS:
        result = Runner.run_sync(agent, [*history, {"role": "user", "content": question}], max_turns=3)
        history = result.to_input_list()
        meanwhile()


def run_smolagents(server: RunningServer) -> None:
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    model = OpenAIServerModel(model_id=server.model_id, api_base=f"{server.url}/v1", api_key="unused", max_tokens=60)
    agent = ToolCallingAgent(tools=[tool(get_weather)], model=model, max_steps=2, verbosity_level=0)
    agent.run(QUESTIONS[0])
    meanwhile()
    agent.run(QUESTIONS[1], reset=False)


def run_ollama(server: RunningServer) -> None:
    import ollama

    client = ollama.Client(host=server.url)
    messages: list[Any] = [{"role": "system", "content": SYSTEM}]
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        answer = client.chat(model=server.model_id, messages=messages, tools=[WEATHER], options={"num_predict": 40})
        messages.append(answer.message.model_dump(exclude_none=True))
        for call in answer.message.tool_calls or []:
            messages.append({"role": "tool", "content": get_weather("Paris"), "tool_name": call.function.name})
        if answer.message.tool_calls:
            answer = client.chat(model=server.model_id, messages=messages, tools=[WEATHER], options={"num_predict": 30})
            messages.append(answer.message.model_dump(exclude_none=True))
        meanwhile()


CLIENTS: dict[str, Callable[[RunningServer], None]] = {
    "openai": run_openai,
    "LangChain": run_langchain,
    "OpenAI Agents SDK": run_agents_sdk,
    "smolagents": run_smolagents,
    "ollama": run_ollama,
}


def main() -> None:
    print(f"{'client':20} {'requests':>8}  {'reused, later requests (min / median)':>38}  {'computed (tokens)':>18}")
    for name, run in CLIENTS.items():
        shares: list[float] = []
        computed: list[int] = []
        data = Path(tempfile.mkdtemp(prefix="agent-clients-"))
        with running_server(data, bundled_model_path(), context_cap=4096, temperature=0.0) as server:
            metrics = server.context.metrics
            count = metrics.completion_ended

            def record(
                usage: Any,
                count: Callable[[Any], None] = count,
                shares: list[float] = shares,
                computed: list[int] = computed,
            ) -> None:
                shares.append(usage.cached_tokens / usage.prompt_tokens)
                computed.append(usage.computed_tokens)
                count(usage)

            metrics.completion_ended = record  # type: ignore[method-assign]
            global meanwhile
            meanwhile = server.serving.engine.flush_cache
            run(server)
        later = shares[1:]
        figures = f"{min(later):.1%} / {statistics.median(later):.1%}" if later else "-"
        spent = f"{min(computed[1:])}-{max(computed[1:])}" if later else "-"
        print(f"{name:20} {len(shares):8}  {figures:>38}  {spent:>18}")


if __name__ == "__main__":
    main()
