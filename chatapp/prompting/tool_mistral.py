"""Mistral's tool calls, opened by `[TOOL_CALLS]` (a special token in Mistral's vocabularies).

Two forms, told apart by the chat template:

- Mistral 7B v0.3 and Nemo: a JSON list of calls, each with the id the model gives it,
  `[TOOL_CALLS][{"name": "f", "arguments": {...}, "id": "a1b2c3d4e"}]`;
- tokenizers v11 and later (Mistral Small 3.2, Devstral, Magistral, Ministral 3): each call
  `[TOOL_CALLS]f[ARGS]{...}`, Small 3.2's with `[CALL_ID]a1b2c3d4e` before `[ARGS]`.

Their templates refuse call ids other than nine letters and digits. Where the model writes an
id, it is the call's id (the result it reads then names the call it made); other ids are made
in that form. The markers are special tokens, which an answer's text leaves out: the grammar
names them as `preserved`, so they are shown and the calls can be read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from chatapp.prompting.call_reader import JsonCallReader
from chatapp.prompting.grammar import Grammar
from chatapp.prompting.json_grammar import RuleSet, literal
from chatapp.prompting.tool_formats import (
    CallIds,
    ParsedAnswer,
    ParsedCall,
    arguments_rule,
    calls_grammar,
    json_call_rule,
)
from chatapp.tools import ToolSpec, arguments_json

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
MISTRAL_IDS = CallIds(9)
ID_RULE = "[a-zA-Z0-9]{9}"
ID_OPENING = literal(', "id": "')
ID_CLOSING = literal('"}')
# A v11 call's head: its name, the id where the model wrote one, `[ARGS]`, and its arguments' first character.
_ARGS_HEAD = re.compile(
    r"\s*(?P<name>[^\s\[]+)(?:" + re.escape(CALL_ID) + r"(?P<id>[A-Za-z0-9]+))?" + re.escape(ARGS) + r"\s*(?=\S)"
)


class MistralJsonToolFormat:
    """`[TOOL_CALLS][{"name": "f", "arguments": {...}, "id": "a1b2c3d4e"}, ...]` (Mistral 7B v0.3, Nemo)."""

    trigger = TOOL_CALLS
    leads: tuple[str, ...] | None = None
    call_ids = MISTRAL_IDS

    def grammar(
        self, tools: Sequence[ToolSpec], *, parallel: bool, lazy: bool, or_schema: dict[str, Any] | None = None
    ) -> Grammar:
        """Calls to `tools` only (see ToolFormat.grammar); several share one list."""
        rules = RuleSet()
        tail = f"{ID_OPENING} {ID_RULE} {ID_CLOSING}"
        bodies = [json_call_rule(rules, index, tool, "arguments", tail) for index, tool in enumerate(tools)]
        rules.add("chatapp-item", f"( {' | '.join(bodies)} )")
        items = 'chatapp-item ( ", " chatapp-item )*' if parallel else "chatapp-item"
        # v0.3's template writes a space before the list (its vocabulary's words begin with one), Nemo's none.
        rules.add("chatapp-call", f'{literal(TOOL_CALLS)} " "? "[" {items} "]"')
        return _grammar(rules, parallel=False, lazy=lazy, or_schema=or_schema, preserved=(TOOL_CALLS,))  # one list

    def call_reader(self) -> JsonCallReader | None:
        """Read whole: the id the model writes follows its arguments (see ToolFormat.call_reader)."""
        return None

    def parse(self, text: str, tools: Sequence[ToolSpec] = ()) -> ParsedAnswer:
        """The text before `[TOOL_CALLS]` and the calls of the list after it (and of any list after that)."""
        start = text.find(TOOL_CALLS)
        if start < 0:
            return ParsedAnswer(text, ())
        content = text[:start].rstrip()
        calls: list[ParsedCall] = []
        decoder = json.JSONDecoder()
        at = start
        while text.startswith(TOOL_CALLS, at):
            at = _after_blank(text, at + len(TOOL_CALLS))
            listed = text.startswith("[", at)
            at = _after_blank(text, at + 1) if listed else at
            while True:
                try:
                    value, at = decoder.raw_decode(text, at)
                except json.JSONDecodeError:
                    return _cut_or_none(text, content, calls)
                call = _json_call(value)
                if call is None:
                    return ParsedAnswer(text, ())
                calls.append(call)
                at = _after_blank(text, at)
                if not (listed and text.startswith(",", at)):
                    break
                at = _after_blank(text, at + 1)
            if listed and not text.startswith("]", at):
                return _cut_or_none(text, content, calls)
            at = _after_blank(text, at + 1 if listed else at)
        return ParsedAnswer(content, tuple(calls))


class MistralArgsToolFormat:
    """`[TOOL_CALLS]f[ARGS]{...}` for each call, with `[CALL_ID]id` before `[ARGS]` where the template has ids
    (Mistral Small 3.2's; Devstral's, Magistral's and Ministral 3's have none)."""

    trigger = TOOL_CALLS
    leads: tuple[str, ...] | None = None
    call_ids = MISTRAL_IDS

    def __init__(self, *, with_ids: bool) -> None:
        self.with_ids = with_ids

    def grammar(
        self, tools: Sequence[ToolSpec], *, parallel: bool, lazy: bool, or_schema: dict[str, Any] | None = None
    ) -> Grammar:
        """Calls to `tools` only (see ToolFormat.grammar); several follow one another."""
        rules = RuleSet()
        call_id = f"( {literal(CALL_ID)} {ID_RULE} )? " if self.with_ids else ""
        bodies = []
        for index, tool in enumerate(tools):
            rule = f"chatapp-tool{index}-call"
            arguments = arguments_rule(rules, index, tool)
            rules.add(rule, f"{literal(TOOL_CALLS + tool.name)} {call_id}{literal(ARGS)} {arguments}")
            bodies.append(rule)
        rules.add("chatapp-call", f"( {' | '.join(bodies)} )")
        preserved = (TOOL_CALLS, CALL_ID, ARGS) if self.with_ids else (TOOL_CALLS, ARGS)
        return _grammar(rules, parallel=parallel, lazy=lazy, or_schema=or_schema, preserved=preserved)

    def call_reader(self) -> JsonCallReader:
        """Each call read as it is written: its name (and id) before `[ARGS]`, then its arguments."""
        return JsonCallReader(TOOL_CALLS, _ARGS_HEAD)

    def parse(self, text: str, tools: Sequence[ToolSpec] = ()) -> ParsedAnswer:
        """The text before the first `[TOOL_CALLS]` and each call after one; no call when one does not parse."""
        start = text.find(TOOL_CALLS)
        if start < 0:
            return ParsedAnswer(text, ())
        content = text[:start].rstrip()
        pieces = text[start + len(TOOL_CALLS) :].split(TOOL_CALLS)
        calls: list[ParsedCall] = []
        for number, piece in enumerate(pieces):
            call = _args_call(piece)
            if call is None:
                last = number == len(pieces) - 1
                return _cut_or_none(text, content, calls) if last else ParsedAnswer(text, ())
            calls.append(call)
        return ParsedAnswer(content, tuple(calls))


def _grammar(
    rules: RuleSet, *, parallel: bool, lazy: bool, or_schema: dict[str, Any] | None, preserved: tuple[str, ...]
) -> Grammar:
    """The root over the rule `chatapp-call`: calls follow one another with nothing between them, as the
    templates write them; lazy, from `[TOOL_CALLS]` anywhere in the answer (text may come before a call)."""
    return calls_grammar(
        rules,
        "chatapp-call",
        parallel=parallel,
        lazy=lazy,
        trigger=TOOL_CALLS,
        or_schema=or_schema,
        separator="",
        preserved=preserved,
    )


def _json_call(value: Any) -> ParsedCall | None:
    """A call of the JSON form; None when `value` is none."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    call_id = value.get("id")
    return ParsedCall(value["name"], arguments_json(arguments), call_id if isinstance(call_id, str) else None)


def _args_call(piece: str) -> ParsedCall | None:
    """`f[CALL_ID]id[ARGS]{...}` (the id optional) as a call; None when it is none."""
    head, found, body = piece.partition(ARGS)
    name, _, call_id = head.partition(CALL_ID)
    name = name.strip()
    if not found or not name or any(character.isspace() for character in name):
        return None
    try:
        arguments, _ = json.JSONDecoder().raw_decode(body.lstrip())
    except json.JSONDecodeError:
        return None
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(name, arguments_json(arguments), call_id.strip() or None)


def _cut_or_none(text: str, content: str, calls: list[ParsedCall]) -> ParsedAnswer:
    """A call that does not parse after whole ones: those stand, the answer cut inside a further one (at
    max_tokens; under the grammar nothing else can break a call); with none before it, the answer is its text."""
    if calls:
        return ParsedAnswer(content, tuple(calls), whole=False)
    return ParsedAnswer(text, ())


def _after_blank(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


MISTRAL_JSON = MistralJsonToolFormat()
MISTRAL_ARGS = MistralArgsToolFormat(with_ids=False)
MISTRAL_ARGS_WITH_IDS = MistralArgsToolFormat(with_ids=True)
