"""Llama 3.1-3.3's tool calls: the answer is one bare JSON object, `{"name": ..., "parameters": {...}}`.

The template shows the tools in the first user message and the results in the `ipython` role
(a `tool` message renders there); the model writes one call per answer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from chatapp.prompting.call_reader import JsonCallReader
from chatapp.prompting.grammar import Grammar
from chatapp.prompting.json_grammar import RuleSet
from chatapp.prompting.tool_formats import ANY_IDS, ParsedAnswer, ParsedCall, calls_grammar, json_call_rule
from chatapp.tools import ToolSpec, arguments_json

OPENING = '{"name": '
PYTHON_TAG = "<|python_tag|>"


class LlamaJsonToolFormat:
    """`{"name": "f", "parameters": {...}}` as the whole answer (or after some text)."""

    trigger = OPENING
    leads: tuple[str, ...] | None = ("", PYTHON_TAG)  # the call is the whole answer, after the python tag at most
    call_ids = ANY_IDS

    def grammar(
        self, tools: Sequence[ToolSpec], *, parallel: bool, lazy: bool, or_schema: dict[str, Any] | None = None
    ) -> Grammar:
        """Calls to `tools` only (see ToolFormat.grammar); one per answer, as the template renders them."""
        rules = RuleSet()
        bodies = [json_call_rule(rules, index, tool, "parameters") for index, tool in enumerate(tools)]
        rules.add("chatapp-call", f"( {' | '.join(bodies)} )")
        return calls_grammar(
            rules, "chatapp-call", parallel=False, lazy=lazy, trigger=OPENING, or_schema=or_schema, at_start=True
        )

    def call_reader(self) -> JsonCallReader:
        """The one call read as it is written."""
        return JsonCallReader()

    def parse(self, text: str, tools: Sequence[ToolSpec] = ()) -> ParsedAnswer:
        """The call that is the whole answer (after blank space or the python tag); otherwise the text as it is.

        JSON within a text is no call, nor a call to a function that is not among the tools.
        """
        body = text.lstrip().removeprefix(PYTHON_TAG).lstrip()
        start = len(text) - len(body)
        if not body.startswith(OPENING):
            return ParsedAnswer(text, ())
        try:
            value, _ = json.JSONDecoder().raw_decode(text, start)
        except json.JSONDecodeError:
            return ParsedAnswer(text, ())
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return ParsedAnswer(text, ())
        if tools and value["name"] not in {tool.name for tool in tools}:
            return ParsedAnswer(text, ())
        arguments = value.get("parameters", value.get("arguments", {}))
        return ParsedAnswer("", (ParsedCall(value["name"], arguments_json(arguments)),))


LLAMA_JSON = LlamaJsonToolFormat()
