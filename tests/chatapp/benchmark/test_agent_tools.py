"""The coding agent's tools are schemas a server can hold calls to, and its calls follow them."""

from __future__ import annotations

from typing import Any

import pytest

from chatapp.benchmark.agent_tools import ARGUMENTS, OUTPUTS, STEP_TOOLS, TOOL_SET, AgentTexts
from chatapp.benchmark.workloads import TextMaker
from chatapp.engine.llama_native import NativeModel
from chatapp.prompting.tool_blocks import HERMES, XML
from chatapp.tools import ToolSpec

TYPES: dict[str, type] = {"string": str, "integer": int, "boolean": bool, "array": list, "object": dict}


def follows(value: Any, schema: dict[str, Any]) -> bool:
    """Whether `value` follows `schema` as far as the tool set's schemas go (types, enums, required, nesting)."""
    if not isinstance(value, TYPES[schema["type"]]) or (schema["type"] == "integer" and isinstance(value, bool)):
        return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if isinstance(value, list):
        return all(follows(item, schema["items"]) for item in value)
    if isinstance(value, dict):
        properties = schema["properties"]
        return set(schema.get("required", ())) <= set(value) <= set(properties) and all(
            follows(item, properties[key]) for key, item in value.items()
        )
    return True


@pytest.fixture(scope="module")
def agent(vocab: NativeModel) -> AgentTexts:
    return AgentTexts(TextMaker(lambda text: vocab.tokenize(text, add_special=False, parse_special=False)))


def test_the_tools_are_a_coding_agents_with_schemas_a_grammar_holds(agent: AgentTexts) -> None:
    tools = agent.tools(1, 0)
    names = [tool.name for tool in tools]
    assert {"read_file", "write_file", "edit_file", "list_dir", "search", "run_command"} <= set(names)
    assert len(set(names)) == len(names) == len(TOOL_SET)
    assert set(STEP_TOOLS) <= set(names) == set(ARGUMENTS) == set(OUTPUTS)
    assert all(tool.description.endswith(".") and tool.parameters["properties"] for tool in tools)
    # A server holding calls to them (tool_choice required, in either call format) takes every schema.
    for form in (HERMES, XML):
        gbnf = form.grammar(tools, parallel=False, lazy=False).gbnf
        assert all(f"chatapp-tool{index}-call ::=" in gbnf for index in range(len(tools)))


def test_usage_notes_grow_the_descriptions(agent: AgentTexts, vocab: NativeModel) -> None:
    def size(tools: tuple[ToolSpec, ...]) -> int:
        return sum(len(vocab.tokenize(tool.description, add_special=False, parse_special=False)) for tool in tools)

    bare, noted = agent.tools(1, 0), agent.tools(1, 200)
    assert [tool.parameters_json for tool in noted] == [tool.parameters_json for tool in bare]
    assert size(noted) >= size(bare) + 200 * len(bare)
    assert agent.tools(1, 200) == noted  # the same every time


def test_every_step_calls_a_tool_with_arguments_that_follow_its_schema(agent: AgentTexts) -> None:
    specs = {tool.name: tool for tool in agent.tools(1, 0)}
    called = set()
    for client in range(3):
        for number in range(len(STEP_TOOLS)):
            call = agent.call(client, number)
            assert follows(call.arguments, specs[call.name].parameters), call
            result = agent.result(client, number, call, 60)
            assert (result.call_id, result.name) == (call.id, call.name)
            assert result.content.strip()
            assert agent.call(client, number) == call
            called.add(call.name)
    assert called == set(STEP_TOOLS)
    ids = {agent.call(client, number).id for client in range(3) for number in range(len(STEP_TOOLS))}
    assert len(ids) == 3 * len(STEP_TOOLS)
