"""What every tool-call format gives: its opening (a lazy grammar's trigger), its grammar and its parse.

The formats (tool_blocks.py: `<tool_call>` blocks; tool_llama.py: Llama 3's bare JSON;
tool_harmony.py: gpt-oss's messages to functions) are found from a model's chat template
(tool_detection.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from chatapp.engine.grammar import Grammar, regex_literal
from chatapp.engine.json_grammar import ROOT, RuleSet
from chatapp.tools import ToolSpec


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
    whole: bool = True  # False: the answer was cut inside a further call, left out of `calls`


class ToolFormat(Protocol):
    """How one family of models writes its calls."""

    trigger: str  # the text that opens a call

    def grammar(
        self, tools: Sequence[ToolSpec], *, parallel: bool, lazy: bool, or_schema: dict[str, Any] | None = None
    ) -> Grammar:
        """Calls to `tools` only, each with arguments that follow its schema.

        Lazy: the answer is free until it opens a call (tool_choice auto). Otherwise the answer
        is calls from its first token (required, or one named function), or JSON following
        `or_schema` instead (a response format beside tools the model may call).
        """
        ...

    def parse(self, text: str, tools: Sequence[ToolSpec] = ()) -> ParsedAnswer:
        """The text before the first call (its end trimmed) and each call; no call when one does not parse."""
        ...


def calls_grammar(
    rules: RuleSet, call: str, *, parallel: bool, lazy: bool, trigger: str, or_schema: Any, at_start: bool = False
) -> Grammar:
    """The root over `call` (one, or several on lines of their own), or JSON of `or_schema` instead.

    Lazy, it waits for `trigger` anywhere in the answer, or with `at_start` only at its beginning
    (a format whose call is the whole answer: JSON elsewhere in a text is no call).
    """
    calls = f'{call} ( "\\n" {call} )*' if parallel else call
    if or_schema is not None:
        calls = f"{calls} | {rules.schema_rule(or_schema, 'chatapp-formatted', 'the response format')}"
    rules.add(ROOT, calls)
    if not lazy or or_schema is not None:
        return Grammar(rules.gbnf(), root=ROOT)
    if at_start:
        return Grammar(rules.gbnf(), root=ROOT, patterns=(f"\\s*({regex_literal(trigger)})[\\s\\S]*",))
    return Grammar(rules.gbnf(), triggers=(trigger,), root=ROOT)
