"""What every tool-call format gives: its opening (a lazy grammar's trigger), its grammar, its parse and its ids.

The formats (tool_blocks.py: `<tool_call>` blocks; tool_llama.py: Llama 3's bare JSON;
tool_mistral.py: Mistral's `[TOOL_CALLS]`; tool_harmony.py: gpt-oss's messages to functions) are
found from a model's chat template (tool_detection.py).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import string
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from chatapp.prompting.call_reader import JsonCallReader
from chatapp.prompting.grammar import Grammar, regex_literal
from chatapp.prompting.json_grammar import ROOT, RuleSet, literal
from chatapp.tools import ToolSpec


@dataclass(frozen=True)
class ParsedCall:
    """A call as the model wrote it: a function's name and its arguments (canonical JSON)."""

    name: str
    arguments_json: str
    id: str | None = None  # the id the model wrote for the call, where its format has one (Mistral's)


@dataclass(frozen=True)
class CallIds:
    """The ids a format's template takes for calls: any text, or `length` letters and digits (Mistral's
    templates refuse any other id)."""

    length: int | None = None

    def new(self) -> str:
        """An id for a call the model wrote none for (OpenAI's form where any id will do)."""
        if self.length is None:
            return f"call_{uuid.uuid4().hex[:24]}"
        return "".join(secrets.choice(ALPHANUMERIC) for _ in range(self.length))

    def for_call(self, own: str | None, taken: Sequence[str]) -> str:
        """The id of a call: the model's own where it wrote one its template takes and no earlier call of the
        answer has (the result then names the id the model saw), else a new one."""
        if own is not None and self.valid(own) and own not in taken:
            return own
        return self.new()

    def valid(self, call_id: str) -> bool:
        """Whether the template takes `call_id` as it is."""
        return self.length is None or (len(call_id) == self.length and all(c in ALPHANUMERIC for c in call_id))

    def for_template(self, call_id: str) -> str:
        """`call_id` as the template is given it: itself when valid, else an id derived from it (the same
        every time, so a prompt stays a function of the conversation; a call and its result keep matching)."""
        if self.length is None or self.valid(call_id):
            return call_id
        return hashlib.sha256(call_id.encode("utf-8")).hexdigest()[: self.length]  # hex: letters and digits


ALPHANUMERIC = string.ascii_letters + string.digits
ANY_IDS = CallIds()


@dataclass(frozen=True)
class ParsedAnswer:
    """An answer split into its text and its calls (no calls: the text is the whole answer)."""

    content: str
    calls: tuple[ParsedCall, ...]
    whole: bool = True  # False: the answer was cut inside a further call, left out of `calls`


class ToolFormat(Protocol):
    """How one family of models writes its calls."""

    trigger: str  # the text that opens a call
    # None: a call may open anywhere in the answer; else only after one of these texts (blank space aside):
    # a format whose call is the whole answer (Llama 3's) reads JSON later in a text as text.
    leads: tuple[str, ...] | None
    call_ids: CallIds  # the ids its template takes

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

    def call_reader(self) -> JsonCallReader | None:
        """A reader of calls while they are written (fed the answer from the first opening on); None where
        calls are read whole once the answer ends."""
        ...


def calls_grammar(
    rules: RuleSet,
    call: str,
    *,
    parallel: bool,
    lazy: bool,
    trigger: str,
    or_schema: Any,
    at_start: bool = False,
    separator: str = "\n",
    preserved: tuple[str, ...] = (),
) -> Grammar:
    """The root over `call` (one, or several with `separator` between them), or JSON of `or_schema` instead.

    Lazy, it waits for `trigger` anywhere in the answer, or with `at_start` only at its beginning
    (a format whose call is the whole answer: JSON elsewhere in a text is no call). `preserved`:
    the format's markers that are special tokens in its models' vocabularies (Grammar.preserved).
    """
    between = f"{literal(separator)} " if separator else ""
    calls = f"{call} ( {between}{call} )*" if parallel else call
    if or_schema is not None:
        calls = f"{calls} | {rules.schema_rule(or_schema, 'chatapp-formatted', 'the response format')}"
    rules.add(ROOT, calls)
    if not lazy or or_schema is not None:
        return Grammar(rules.gbnf(), root=ROOT, preserved=preserved)
    if at_start:
        pattern = f"\\s*({regex_literal(trigger)})[\\s\\S]*"
        return Grammar(rules.gbnf(), root=ROOT, patterns=(pattern,), preserved=preserved)
    return Grammar(rules.gbnf(), triggers=(trigger,), root=ROOT, preserved=preserved)


def arguments_rule(rules: RuleSet, index: int, tool: ToolSpec) -> str:
    """The rule for the arguments of `tool` (its parameters' schema), named after its place among the tools."""
    return rules.schema_rule(tool.parameters, f"chatapp-tool{index}-arguments", f"tools[{index}].parameters", tool=True)


def json_call_rule(rules: RuleSet, index: int, tool: ToolSpec, key: str, tail: str = '"}"') -> str:
    """Add the rule for a call to `tool` written as JSON, `{"name": "f", "<key>": <arguments>` then `tail`
    (GBNF); its name."""
    rule = f"chatapp-tool{index}-call"
    opening = literal('{"name": ' + json.dumps(tool.name, ensure_ascii=False) + f', "{key}": ')
    rules.add(rule, f"{opening} {arguments_rule(rules, index, tool)} {tail}")
    return rule
