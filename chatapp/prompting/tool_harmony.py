"""gpt-oss's tool calls (harmony): a message to `functions.NAME` on the commentary channel, JSON inside.

`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}` then `<|call|>`, which
ends the answer: one call per answer, as gpt-oss is trained and as its template renders an
assistant message (only its first call). Its reasoning may come first, in messages of its own
(harmony.py reads them). Results come back as `<|start|>functions.NAME to=assistant<|channel|>
commentary<|message|>"..."<|end|>` (the template writes them, each result as a JSON string).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from chatapp.prompting.call_reader import JsonCallReader
from chatapp.prompting.grammar import Grammar, regex_literal
from chatapp.prompting.harmony import (
    CHANNEL,
    CONSTRAIN,
    END,
    FUNCTIONS,
    MESSAGE,
    NEXT_MESSAGE,
    HarmonyCall,
    HarmonyReader,
)
from chatapp.prompting.json_grammar import ROOT, RuleSet, anything_but, literal
from chatapp.prompting.tool_formats import ANY_IDS, ParsedAnswer, ParsedCall
from chatapp.tools import ToolSpec, arguments_json

RECIPIENT = " to=" + FUNCTIONS
CALL_CHANNELS = ("commentary", "analysis")  # llama.cpp takes calls on analysis too: gpt-oss writes some there
# The template writes `commentary json`, OpenAI's guide `commentary to=functions.f <|constrain|>json`.
CONSTRAINTS = (" " + CONSTRAIN + "json", CONSTRAIN + "json", " json")
_NAME_PLACE = "\x00"
_ESCAPED_NAME = r"(?:[^\\^$.|?*+()\[\]{}]|\\[\\^$.|?*+()\[\]{}])+"


def trigger_pattern(names: Sequence[str]) -> str:
    """Where a lazy grammar takes over (the whole text so far must match; it holds from the group on):
    a whole call header, naming one of `names`, at the start of the answer or right after
    `<|start|>assistant`; elsewhere (inside the reasoning) it is text.

    The header is the model's own (the grammar holds the arguments): the token that completes it is
    `<|message|>`, so the text the grammar is given is always one it takes. A trigger that ended
    inside the header could end inside a token that goes on with something the grammar refuses,
    and llama.cpp ends the process then.
    """
    name = "(?:" + "|".join(regex_literal(name) for name in names) + ")"
    channel = "(?:" + "|".join(CALL_CHANNELS) + ")"
    recipient = regex_literal(RECIPIENT) + name
    headers = f"{regex_literal(CHANNEL)}{channel}{recipient}|{recipient}{regex_literal(CHANNEL)}{channel}"
    constraint = "(?:" + "|".join(regex_literal(form) for form in CONSTRAINTS) + ")?"
    header = f"(?:{headers}){constraint}{regex_literal(MESSAGE)}"
    return f"(?:[\\s\\S]*{regex_literal(NEXT_MESSAGE)})?({header})[\\s\\S]*"


_NAMES = "(" + _ESCAPED_NAME + "(?:\\|" + _ESCAPED_NAME + ")*)"  # the names in a trigger pattern, as literals
_TRIGGER_FORM = re.compile(_NAMES.join(map(re.escape, trigger_pattern([_NAME_PLACE]).split(_NAME_PLACE))))


def is_trigger_pattern(pattern: str) -> bool:
    """Whether `pattern` is one `trigger_pattern` writes (names as literals): safe for llama.cpp's std::regex."""
    found = _TRIGGER_FORM.fullmatch(pattern)
    return found is not None and found.group(1) == found.group(2)


class HarmonyToolFormat:
    """Calls as harmony messages to `functions.NAME`; the user sees the preambles' and the reply's text."""

    trigger = RECIPIENT.lstrip()
    leads: tuple[str, ...] | None = None
    call_ids = ANY_IDS  # the template prints no call ids

    def grammar(
        self, tools: Sequence[ToolSpec], *, parallel: bool, lazy: bool, or_schema: dict[str, Any] | None = None
    ) -> Grammar:
        """A call to one of `tools` (see ToolFormat.grammar); `parallel` changes nothing: `<|call|>` ends
        the answer. Not lazy, reasoning and preambles may come first; with `or_schema`, the reply
        on the final channel may be that JSON instead."""
        rules = RuleSet()
        channel = f"( {' | '.join(literal(name) for name in CALL_CHANNELS)} )"
        rules.add("chatapp-constraint", f"( {' | '.join(literal(form) for form in CONSTRAINTS)} )")
        bodies = []
        for index, tool in enumerate(tools):
            arguments = rules.schema_rule(
                tool.parameters, f"chatapp-tool{index}-arguments", f"tools[{index}].parameters", tool=True
            )
            recipient = literal(RECIPIENT + tool.name)
            headers = f"{literal(CHANNEL)} {channel} {recipient} | {recipient} {literal(CHANNEL)} {channel}"
            rule = f"chatapp-tool{index}-call"
            rules.add(rule, f"( {headers} ) chatapp-constraint? {literal(MESSAGE)} {arguments}")
            bodies.append(rule)
        rules.add("chatapp-call", f"( {' | '.join(bodies)} )")
        if lazy and or_schema is None:
            rules.add(ROOT, "chatapp-call")
            return Grammar(rules.gbnf(), root=ROOT, patterns=(trigger_pattern([tool.name for tool in tools]),))
        answer = "chatapp-call"
        if or_schema is not None:
            formatted = rules.schema_rule(or_schema, "chatapp-formatted", "the response format")
            reply = f"{literal(CHANNEL + 'final')} chatapp-constraint? {literal(MESSAGE)} {formatted}"
            answer = f"( chatapp-call | {reply} )"
        rules.add("chatapp-thought", f"( {anything_but(END)} )*")
        opening = f"( {literal(CHANNEL)} {channel} {literal(MESSAGE)} chatapp-thought {literal(END + NEXT_MESSAGE)} )"
        rules.add(ROOT, f"{opening}* {answer}")
        return Grammar(rules.gbnf(), root=ROOT)

    def call_reader(self) -> JsonCallReader | None:
        """Read whole, from the harmony messages (see ToolFormat.call_reader)."""
        return None

    def parse(self, text: str, tools: Sequence[ToolSpec] = ()) -> ParsedAnswer:
        """The text the user sees and each call; no call when one does not parse or names no tool.

        Text that does not begin as harmony does is all content.
        """
        reader = HarmonyReader()
        content = reader.feed(text) + reader.finish()
        calls: list[ParsedCall] = []
        for call in reader.calls:
            parsed = _parsed_call(call, tools)
            if parsed is None and not call.closed and calls:
                return ParsedAnswer(content, tuple(calls), whole=False)  # the whole ones stand
            if parsed is None:
                return ParsedAnswer(content, ())
            calls.append(parsed)
        return ParsedAnswer(content, tuple(calls))


def _parsed_call(call: HarmonyCall, tools: Sequence[ToolSpec]) -> ParsedCall | None:
    """The call a message to a function makes: its body a JSON object, its name among the tools."""
    if tools and call.name not in {tool.name for tool in tools}:
        return None
    try:
        value = json.loads(call.body, strict=False)  # control characters in strings: the grammar lets them in
    except json.JSONDecodeError:
        return None
    return ParsedCall(call.name, arguments_json(value)) if isinstance(value, dict) else None


HARMONY = HarmonyToolFormat()
