"""Calls read while they are written, for formats that write a call's arguments as JSON after its name:
`{"name": "f", "arguments": {...}}` (Hermes' blocks, Llama 3's), `[TOOL_CALLS]f[ARGS]{...}` (Mistral's v11).

A stream can then say which function is called as soon as its name is complete and send the
arguments as they come, as the hosted APIs do (and llama-server), instead of holding the
whole call until the answer ends. The arguments are handed on as the model writes them: their
pieces join to JSON text whose value is the call's (the answer read whole canonicalises it).
Formats whose calls are read whole only (Mistral's JSON list, whose ids follow the arguments;
parameter blocks; harmony) have no reader: their calls are sent once the answer ends.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

# A call's beginning up to its arguments: complete only once the arguments' first character is written.
# A head names the function (`quoted`: as a JSON string, else `name`) and may carry the model's id (`id`).
JSON_CALL_HEAD = re.compile(
    r'\s*\{\s*"name"\s*:\s*"(?P<quoted>(?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\S)'
)
# The head so far, its name begun: what a grammar that holds names to a list may decide already.
JSON_NAME_BEGUN = re.compile(r'\s*\{\s*"name"\s*:\s*"(?P<begun>[^"\\]*)(?P<closed>")?')
_LONGEST_HEAD = 4096  # characters without a call's head: not a call this reader can follow


@dataclass(frozen=True)
class CallNamed:
    """A call began: the function it calls, and the id the model wrote for it (where its format has one)."""

    name: str
    call_id: str | None = None


@dataclass(frozen=True)
class ArgumentsWritten:
    """More of the current call's arguments (JSON text as the model writes it)."""

    text: str


@dataclass(frozen=True)
class CallWritten:
    """The current call's arguments are complete."""


CallNews = CallNamed | ArgumentsWritten | CallWritten


class JsonValueEnd:
    """Finds where one JSON value ends in text given piece by piece (strings and nesting followed)."""

    def __init__(self) -> None:
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._started = False

    def feed(self, piece: str) -> int | None:
        """The offset in `piece` just past the value's end; None while it goes on."""
        for offset, char in enumerate(piece):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
                    if self._depth == 0:
                        return offset + 1
                continue
            if char in " \t\r\n,}]" and self._depth == 0 and self._started:
                return offset  # a number or a literal ended
            self._started = True
            if char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth <= 0:
                    return offset + 1
        return None


class JsonCallReader:
    """Follows calls whose arguments are JSON after a `head`, each call after `opening` (Hermes' `<tool_call>`,
    Mistral's `[TOOL_CALLS]`), or one call that is the whole answer (`opening` empty: Llama 3's)."""

    def __init__(self, opening: str = "", head: re.Pattern[str] = JSON_CALL_HEAD) -> None:
        self._opening = opening
        self._head = head
        self._buffer = ""  # text not yet read: before a call's opening, or its head
        self._seeking = bool(opening)  # looking for the next opening (else for a head)
        self._value: JsonValueEnd | None = None  # the arguments being written
        self._done = False
        self._spellings: dict[str, str] = {}  # each name the grammar allows, as JSON writes it inside quotes
        self._named_early: str | None = None  # the current call's name, announced before its head was complete

    def names_held_to(self, names: tuple[str, ...]) -> None:
        """A grammar holds every call's name to one of `names`: a call is announced as soon as its name's
        beginning fits one of them alone, tokens before its head is complete. Only for JSON heads after an
        opening (Hermes' `<tool_call>`, the grammar's trigger): a call that is the whole answer (Llama 3's) may
        follow a marker the grammar reads as text, and then no grammar holds it."""
        if self._head is JSON_CALL_HEAD and self._opening:
            self._spellings = {json.dumps(name, ensure_ascii=False)[1:-1]: name for name in names}

    def feed(self, piece: str) -> list[CallNews]:
        """What `piece` (the answer's next text, from the first call's opening on) tells of its calls."""
        news: list[CallNews] = []
        text = piece
        while text and not self._done:
            if self._value is not None:
                end = self._value.feed(text)
                written = text if end is None else text[:end]
                if written:
                    news.append(ArgumentsWritten(written))
                if end is None:
                    return news
                news.append(CallWritten())
                self._value = None
                several = bool(self._opening)  # each call after its opening; else the one call is the answer
                self._seeking, self._done = several, not several
                text = text[end:]
                continue
            self._buffer += text
            text = ""
            if self._seeking:
                start = self._buffer.find(self._opening)
                if start < 0:
                    self._buffer = self._buffer[-len(self._opening) :]
                    return news
                self._buffer = self._buffer[start + len(self._opening) :]
                self._seeking = False
            head = self._head.match(self._buffer)
            if head is None:
                self._done = len(self._buffer) > _LONGEST_HEAD
                news += self._name_decided()
                return news
            named = _named(head)
            early, self._named_early = self._named_early, None
            if named is None or (early is not None and named.name != early):
                self._done = True  # (a name other than the one announced: no grammar held it after all)
                return news
            if early is None:
                news.append(named)
            self._value = JsonValueEnd()
            text, self._buffer = self._buffer[head.end() :], ""
        return news

    def _name_decided(self) -> list[CallNews]:
        """The call, announced once, when the grammar leaves its name one choice (before its head is whole)."""
        if not self._spellings or self._named_early is not None:
            return []
        begun = JSON_NAME_BEGUN.match(self._buffer)
        if begun is None:
            return []
        written = begun["begun"]
        if begun["closed"]:
            fitting = [name for spelling, name in self._spellings.items() if spelling == written]
        else:
            fitting = [name for spelling, name in self._spellings.items() if spelling.startswith(written)]
        if len(fitting) != 1:
            return []
        self._named_early = fitting[0]
        return [CallNamed(fitting[0])]


def _named(head: re.Match[str]) -> CallNamed | None:
    """The call a head begins; None when its quoted name is not a JSON string after all."""
    fields = head.groupdict()
    call_id = fields.get("id")
    if fields.get("quoted") is None:
        return CallNamed(fields["name"], call_id)
    try:
        return CallNamed(json.loads(f'"{fields["quoted"]}"'), call_id)
    except json.JSONDecodeError:
        return None
