"""How a model writes tool calls, found from its chat template: the text it emits, its grammar, its parse.

A template that renders `tools` and marks calls with `<tool_call>` (Hermes, Qwen 2.5, Qwen 3
and many fine-tunes) is used as it is: the model's own format. Any other template (the
bundled SmolLM2's has no tools at all) gets the same format taught in the system prompt
(`instructions`), and the call is held to it by a grammar, so every model can call tools.
Tool results then go back as a user message of `<tool_response>` blocks, as Hermes does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chatapp.engine.grammar import Grammar
from chatapp.engine.json_grammar import RuleSet, literal
from chatapp.tools import ToolCall, ToolResult, ToolSpec, arguments_json

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
RESULT_OPEN = "<tool_response>"
RESULT_CLOSE = "</tool_response>"
NEWLINE = "\n"
_CALL_BLOCK = re.compile(re.escape(CALL_OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CALL_CLOSE) + r"|$)", re.DOTALL)


@dataclass(frozen=True)
class ParsedCall:
    """A call as the model wrote it: a function's name and its arguments (canonical JSON)."""

    name: str
    arguments_json: str


@dataclass(frozen=True)
class ParsedAnswer:
    """An answer split into its text and its calls (no calls: the text is the whole answer)."""

    content: str
    calls: tuple[ParsedCall, ...]


class HermesToolFormat:
    """`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one block per call."""

    trigger = CALL_OPEN

    def grammar(
        self, tools: Sequence[ToolSpec], *, parallel: bool, lazy: bool, or_schema: dict[str, Any] | None = None
    ) -> Grammar:
        """Calls to `tools` only, each with arguments that follow its schema.

        Lazy: the answer is free until it opens a call (tool_choice auto). Otherwise the answer
        is calls from its first token (required, or one named function), or JSON following
        `or_schema` instead (a response format beside tools the model may call).
        """
        rules = RuleSet()
        bodies = []
        for index, tool in enumerate(tools):
            arguments = rules.schema_rule(tool.parameters, f"tool{index}-arguments", f"tools[{index}].parameters")
            rule = f"tool{index}-call"
            opening = literal('{"name": ' + json.dumps(tool.name, ensure_ascii=False) + ', "arguments": ')
            rules.add(rule, f'{opening} {arguments} "}}"')
            bodies.append(rule)
        rules.add("call", f"{literal(CALL_OPEN + NEWLINE)} ( {' | '.join(bodies)} ) {literal(NEWLINE + CALL_CLOSE)}")
        calls = 'call ( "\\n" call )*' if parallel else "call"
        if or_schema is not None:
            calls = f"{calls} | {rules.schema_rule(or_schema, 'formatted', 'the response format')}"
        rules.add("root", calls)
        return Grammar(rules.gbnf(), triggers=(CALL_OPEN,) if lazy and or_schema is None else ())

    def parse(self, text: str) -> ParsedAnswer:
        """The text before the first call (its end trimmed) and each call; no call when one does not parse."""
        start = text.find(CALL_OPEN)
        if start < 0:
            return ParsedAnswer(text, ())
        calls: list[ParsedCall] = []
        for block in _CALL_BLOCK.finditer(text, start):
            call = _parsed_call(block.group(1))
            if call is None and not block.group(0).endswith(CALL_CLOSE) and calls:
                break  # the answer was cut inside a further call: the whole ones stand
            if call is None:
                return ParsedAnswer(text, ())
            calls.append(call)
        return ParsedAnswer(text[:start].rstrip(), tuple(calls))

    def call_text(self, call: ToolCall) -> str:
        """A call as the model writes it (for an earlier call whose generated tokens are not known)."""
        body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
        return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"

    def results_text(self, results: Sequence[ToolResult]) -> str:
        """Consecutive results as one user message, a block each."""
        return "\n".join(f"{RESULT_OPEN}\n{result.content}\n{RESULT_CLOSE}" for result in results)

    def instructions(self, tools: Sequence[ToolSpec]) -> str:
        """The format taught in the system prompt, for a template that has no tools of its own."""
        schemas = "\n".join(json.dumps(tool.template_input(), ensure_ascii=False) for tool in tools)
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{schemas}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            f"{CALL_OPEN}{CALL_CLOSE} XML tags:\n"
            f'{CALL_OPEN}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{CALL_CLOSE}'
        )


def _parsed_call(body: str) -> ParsedCall | None:
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    return ParsedCall(value["name"], arguments_json(arguments))


HERMES = HermesToolFormat()
PROBE_TOOL = ToolSpec("chatapp_probe_function", "probe", '{"type":"object","properties":{}}')


def native_format(template_source: str, renders_tools: bool) -> HermesToolFormat | None:
    """The template's own call format when it is one we parse; None: teach Hermes in the system prompt."""
    if renders_tools and CALL_OPEN in template_source and "<function=" not in template_source:
        return HERMES
    return None
