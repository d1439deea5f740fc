"""What an API request asks the answer to be: free text, calls to its tools, or JSON of a schema.

One place turns that into a grammar for sampling (never into the prompt: a request with a
grammar reuses the same cached prefix as one without) and reads the answer back into text
and calls. Both APIs (OpenAI's and Ollama's) describe their requests with `AnswerShape`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from chatapp.errors import ChatappError, GrammarError
from chatapp.prompting.grammar import TRIGGER_PATTERN_FULL, TRIGGER_WORD, Grammar
from chatapp.prompting.json_grammar import ANY_OBJECT, schema_grammar
from chatapp.prompting.prompt import PromptBuilder
from chatapp.prompting.tool_harmony import HarmonyToolFormat, is_trigger_pattern
from chatapp.tools import ToolCall, ToolSpec


class ToolChoice(StrEnum):
    """OpenAI's `tool_choice`: may call (auto), must not (none), must (required), must call one (function)."""

    AUTO = "auto"
    NONE = "none"
    REQUIRED = "required"
    FUNCTION = "function"


class ShapeError(ChatappError):
    """The answer cannot be shaped as asked (HTTP 400); `param` names the field at fault."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class AnswerShape:
    """The tools offered and how they may be used, or the JSON the answer must be."""

    tools: tuple[ToolSpec, ...] = ()
    choice: ToolChoice = ToolChoice.AUTO
    function: str | None = None  # with ToolChoice.FUNCTION: the one to call
    parallel: bool = False  # several calls in one answer
    json_schema: str | None = None  # canonical JSON of the schema the whole answer follows
    schema_param: str = "response_format"

    def with_tools_by_name(self) -> AnswerShape:
        """The same, its tools in name order (`chatapp serve --sort-tools`)."""
        return replace(self, tools=tuple(sorted(self.tools, key=lambda tool: tool.name)))

    @property
    def calls_tools(self) -> bool:
        """Whether the answer is read for calls."""
        return bool(self.tools) and self.choice is not ToolChoice.NONE

    def names_held_by_grammar(self) -> tuple[str, ...]:
        """The functions every call must name, from its head on (the grammar holds it to them); none beside a
        response format, whose JSON may begin as a call does (`{"name": "...`) and be no call."""
        if self.json_schema is not None:
            return ()
        return tuple(tool.name for tool in self._callable_tools())

    def _callable_tools(self) -> tuple[ToolSpec, ...]:
        if self.choice is ToolChoice.FUNCTION:
            return tuple(tool for tool in self.tools if tool.name == self.function)
        return self.tools

    def grammar(self, builder: PromptBuilder | None) -> Grammar | None:
        """The grammar that holds the answer to this shape (None: free text); ShapeError when it cannot."""
        try:
            if self.calls_tools and builder is not None:
                return self._call_grammar(builder)
            if self.json_schema is not None:
                return schema_grammar(json.loads(self.json_schema), self.schema_param)
        except GrammarError as error:
            raise ShapeError(str(error), "tools" if self.calls_tools else self.schema_param) from None
        return None

    def _call_grammar(self, builder: PromptBuilder) -> Grammar:
        tools = self._callable_tools()
        if self.choice is ToolChoice.FUNCTION and not tools:
            names = ", ".join(tool.name for tool in self.tools)
            raise ShapeError(
                f"tool_choice names the function {self.function!r}, which is not among the tools ({names})",
                "tool_choice",
            )
        parallel = self.parallel and self.choice is not ToolChoice.FUNCTION
        lazy = self.choice is ToolChoice.AUTO
        # With a response format too, the answer is a call or that JSON (Ollama's tools beside `format`).
        formatted = json.loads(self.json_schema) if lazy and self.json_schema is not None else None
        return builder.tool_format.grammar(tools, parallel=parallel, lazy=lazy, or_schema=formatted)


FREE_TEXT = AnswerShape()  # no tools, no format: the answer as the model writes it


# A literal (special characters escaped) after any text or after blank space, then anything.
SAFE_PATTERN = re.compile(r"(?:\[\\s\\S\]\*\?|\\s\*)\((?:[^\\^$.|?*+()\[\]{}]|\\[\\^$.|?*+()\[\]{}])+\)\[\\s\\S\]\*")
AnswerGrammar = Grammar  # what the server's llama routes hand on to Serving.complete


def server_grammar(
    gbnf: str, *, lazy: bool, triggers: list[tuple[int, str]], preserved: tuple[str, ...] = ()
) -> Grammar:
    """A grammar as llama-server's /completion takes it (what a chatapp in front of this one sends);
    `preserved`: the special tokens the answer's text shows (llama-server's `preserved_tokens`)."""
    if lazy and not triggers:
        raise ShapeError("grammar_lazy needs grammar_triggers; send the words that start the grammar", "grammar_lazy")
    for kind, _ in triggers:
        if kind not in (TRIGGER_WORD, TRIGGER_PATTERN_FULL):
            raise ShapeError(
                f"grammar trigger type {kind} is not supported; send words ({TRIGGER_WORD}) "
                f"or whole-text patterns ({TRIGGER_PATTERN_FULL})",
                "grammar_triggers",
            )
    if not lazy:
        return Grammar(gbnf, preserved=preserved)
    for kind, value in triggers:
        if kind == TRIGGER_PATTERN_FULL and not SAFE_PATTERN.fullmatch(value) and not is_trigger_pattern(value):
            # llama.cpp compiles patterns with std::regex, whose errors would end the process: only
            # the forms chatapp sends (a literal, anywhere or at the start; gpt-oss's call headers) are taken.
            raise ShapeError(
                f"grammar trigger pattern {value!r} is not one this server takes; send words (type "
                f"{TRIGGER_WORD}) or chatapp's own patterns",
                "grammar_triggers",
            )
    words = tuple(value for kind, value in triggers if kind == TRIGGER_WORD)
    patterns = tuple(value for kind, value in triggers if kind == TRIGGER_PATTERN_FULL)
    return Grammar(gbnf, words, patterns=patterns, preserved=preserved)


def json_object_shape(param: str) -> AnswerShape:
    """Any JSON object (OpenAI's `json_object`, Ollama's `format: "json"`)."""
    return AnswerShape(json_schema=json.dumps(ANY_OBJECT), schema_param=param)


def schema_shape(schema: Any, param: str) -> AnswerShape:
    """JSON following `schema`; ShapeError when the schema is not a JSON object."""
    if not isinstance(schema, dict):
        raise ShapeError(f"{param} must be a JSON schema (an object)", param)
    return AnswerShape(json_schema=json.dumps(schema), schema_param=param)  # property order kept


@dataclass(frozen=True)
class ShapedAnswer:
    """An answer read back: its text and the calls it made (each with the id this server gave it)."""

    content: str
    calls: tuple[ToolCall, ...] = ()
    whole: bool = True  # False: cut inside a further call (its ids do not spell content and calls)


def speaks_harmony(builder: PromptBuilder | None) -> bool:
    """Whether the model answers in harmony (gpt-oss): its reasoning is never shown."""
    return builder is not None and isinstance(builder.tool_format, HarmonyToolFormat)


def read_answer(text: str, shape: AnswerShape, builder: PromptBuilder | None) -> ShapedAnswer:
    """`text` split into content and calls when the request offered tools; otherwise the text as it is,
    but for a model that answers in harmony (gpt-oss): its reply without its reasoning, always."""
    if builder is None:
        return ShapedAnswer(text)
    form = builder.tool_format
    if not shape.calls_tools:
        return ShapedAnswer(form.parse(text).content if speaks_harmony(builder) else text)
    parsed = form.parse(text, shape.tools)
    calls: list[ToolCall] = []
    for call in parsed.calls:
        call_id = form.call_ids.for_call(call.id, [made.id for made in calls])
        calls.append(ToolCall(call_id, call.name, call.arguments_json))
    return ShapedAnswer(parsed.content, tuple(calls), parsed.whole)


def shown_text(text: str, builder: PromptBuilder | None) -> str:
    """What a screen shows of a saved answer: a harmony answer's (gpt-oss) preambles and reply, else the text."""
    return read_answer(text, AnswerShape(), builder).content
