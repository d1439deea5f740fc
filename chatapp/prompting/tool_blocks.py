"""Calls written as blocks between `<tool_call>` and `</tool_call>`: JSON inside or parameter blocks.

A template that renders `tools` and marks calls with `<tool_call>` is used as it is, the
model's own format: JSON inside (Hermes, Qwen 2.5, Qwen 3 and many fine-tunes) or parameter
blocks (Qwen3-Coder, Qwen 3.5). Any template whose format is not known here (the bundled
SmolLM2's has no tools at all) gets the Hermes format taught in the system prompt
(`instructions`), the call held to it by a grammar, so every model can call tools; tool
results then go back as a user message of `<tool_response>` blocks, as Hermes does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from chatapp.prompting.call_reader import JsonCallReader
from chatapp.prompting.grammar import Grammar
from chatapp.prompting.json_grammar import RuleSet, anything_but, enforceable_part, literal
from chatapp.prompting.tool_formats import ANY_IDS, ParsedAnswer, ParsedCall, calls_grammar, json_call_rule
from chatapp.tools import ToolCall, ToolResult, ToolSpec, arguments_json

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
RESULT_OPEN = "<tool_response>"
RESULT_CLOSE = "</tool_response>"
PARAMETER_CLOSE = "</parameter>"
NEWLINE = "\n"
# The Hermes format as taught (Qwen 2.5's words): this text, each tool's schema on a line, then the rest.
TEACHING_BEFORE_SCHEMAS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TEACHING_AFTER_SCHEMAS = (
    "</tools>\n\nFor each function call, return a json object with function name and arguments within "
    f"{CALL_OPEN}{CALL_CLOSE} XML tags:\n"
    f'{CALL_OPEN}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{CALL_CLOSE}'
)

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)
_CALL_BLOCK = re.compile(re.escape(CALL_OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CALL_CLOSE) + r"|$)", re.DOTALL)


class BlockToolFormat:
    """Calls written as blocks between `<tool_call>` and `</tool_call>`; a subclass says what a block holds."""

    trigger = CALL_OPEN
    leads: tuple[str, ...] | None = None
    call_ids = ANY_IDS

    def grammar(
        self, tools: Sequence[ToolSpec], *, parallel: bool, lazy: bool, or_schema: dict[str, Any] | None = None
    ) -> Grammar:
        """Calls to `tools` only (see ToolFormat.grammar)."""
        rules = RuleSet()
        bodies = [self._body_rule(rules, index, tool) for index, tool in enumerate(tools)]
        # Blank space is let in around the body: a token that completes the opening may carry some,
        # and a lazy grammar must accept every character of that token.
        rules.add("chatapp-blank", "[ \\t\\n]{0,4}")
        rules.add(
            "chatapp-call",
            f"{literal(CALL_OPEN)} chatapp-blank ( {' | '.join(bodies)} ) chatapp-blank {literal(CALL_CLOSE)}",
        )
        return calls_grammar(
            rules, "chatapp-call", parallel=parallel, lazy=lazy, trigger=CALL_OPEN, or_schema=or_schema
        )

    def parse(self, text: str, tools: Sequence[ToolSpec] = ()) -> ParsedAnswer:
        """The text before the first call (its end trimmed) and each call; no call when one does not parse."""
        start = text.find(CALL_OPEN)
        if start < 0:
            return ParsedAnswer(text, ())
        calls: list[ParsedCall] = []
        for block in _CALL_BLOCK.finditer(text, start):
            call = self._parsed_body(block.group(1), tools)
            if call is None and not block.group(0).endswith(CALL_CLOSE) and calls:
                return ParsedAnswer(text[:start].rstrip(), tuple(calls), whole=False)  # the whole ones stand
            if call is None:
                return ParsedAnswer(text, ())
            calls.append(call)
        return ParsedAnswer(text[:start].rstrip(), tuple(calls))

    def call_reader(self) -> JsonCallReader | None:
        """Calls in parameter blocks are read whole (see ToolFormat.call_reader)."""
        return None

    def _body_rule(self, rules: RuleSet, index: int, tool: ToolSpec) -> str:
        """Add the rule for a call to `tool` (the block's inside); its name."""
        raise NotImplementedError

    def _parsed_body(self, body: str, tools: Sequence[ToolSpec]) -> ParsedCall | None:
        """The call a block holds; None when it holds none."""
        raise NotImplementedError


class HermesToolFormat(BlockToolFormat):
    """`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (Hermes, Qwen 2.5, Qwen 3)."""

    def call_reader(self) -> JsonCallReader:
        """Each block's JSON read as it is written."""
        return JsonCallReader(CALL_OPEN)

    def _body_rule(self, rules: RuleSet, index: int, tool: ToolSpec) -> str:
        return json_call_rule(rules, index, tool, "arguments")

    def _parsed_body(self, body: str, tools: Sequence[ToolSpec]) -> ParsedCall | None:
        try:
            value = json.loads(body)
        except json.JSONDecodeError:
            return None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return None
        arguments = value.get("arguments", value.get("parameters", {}))
        return ParsedCall(value["name"], arguments_json(arguments))

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
        return f"{TEACHING_BEFORE_SCHEMAS}\n{schemas}\n{TEACHING_AFTER_SCHEMAS}"


class XmlToolFormat(BlockToolFormat):
    """`<tool_call>\n<function=f>\n<parameter=k>\nvalue\n</parameter>\n</function>\n</tool_call>`.

    Qwen3-Coder's and Qwen 3.5's form: each argument a parameter block, a text as it is and any
    other value as JSON, typed back by the tool's schema.
    """

    def _body_rule(self, rules: RuleSet, index: int, tool: ToolSpec) -> str:
        where = f"tools[{index}].parameters"
        parameters = tool.parameters
        parameters = enforceable_part(parameters)  # the client validates what a grammar cannot hold
        required = set(parameters.get("required") or ())
        rules.add("chatapp-text", f"( {anything_but(PARAMETER_CLOSE)} )*")  # a text value: all but its closing tag
        pieces = []
        # A parameter's schema may refer to the root's definitions (a Pydantic model's `$ref`): they go with it.
        definitions = {key: parameters[key] for key in ("$defs", "definitions") if key in parameters}
        for number, (name, schema) in enumerate((parameters.get("properties") or {}).items()):
            if isinstance(schema, dict) and definitions:
                schema = {**definitions, **schema}
            if _is_text(schema):
                value = _text_rule(rules, schema, f"{where}.properties.{name}")
            else:
                value = rules.schema_rule(
                    schema, f"chatapp-tool{index}-value{number}", f"{where}.properties.{name}", tool=True
                )
            piece = f"{literal(f'<parameter={name}>' + NEWLINE)} {value} {literal(NEWLINE + '</parameter>' + NEWLINE)}"
            pieces.append(piece if name in required else f"( {piece} )?")
        rule = f"chatapp-tool{index}-call"
        rules.add(rule, f"{literal(f'<function={tool.name}>' + NEWLINE)} {' '.join(pieces)} {literal('</function>')}")
        return rule

    def _parsed_body(self, body: str, tools: Sequence[ToolSpec]) -> ParsedCall | None:
        function = _FUNCTION.match(body.strip())
        if function is None:
            return None
        name = function.group(1).strip()
        spec = next((tool for tool in tools if tool.name == name), None)
        properties = (spec.parameters.get("properties") or {}) if spec is not None else {}
        arguments = {
            found.group(1).strip(): _typed(found.group(2), properties.get(found.group(1).strip(), {}))
            for found in _PARAMETER.finditer(function.group(2))
        }
        return ParsedCall(name, arguments_json(arguments))


def _text_rule(rules: RuleSet, schema: dict[str, Any], where: str) -> str:
    """A text value as it stands between the tags: one of its enum's values as they are, its length bounds kept
    (a `pattern` or `format` is left to the client, which validates a call before it runs it)."""
    if "enum" in schema:
        return f"( {' | '.join(literal(str(value)) for value in schema['enum'])} )"
    low, high = schema.get("minLength"), schema.get("maxLength")
    if low is None and high is None:
        return "chatapp-text"
    rule = f"chatapp-text-{low or 0}-{'' if high is None else high}"
    rules.add(rule, f"[^<]{{{low or 0},{'' if high is None else high}}}")
    return rule


def _is_text(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "string"


def _typed(raw: str, schema: Any) -> Any:
    """A parameter's text as the value its schema names (a text stays text; JSON otherwise, Python's
    True and False as booleans, and anything unreadable as the text it is)."""
    if _is_text(schema):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return {"True": True, "False": False, "None": None}.get(raw.strip(), raw)


HERMES = HermesToolFormat()
XML = XmlToolFormat()
