"""What a stream shows of an answer that may turn into calls: its text pieces join to the whole answer's text,
its calls are the calls the answer made, shown as they are written."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import cast

from hypothesis import given
from hypothesis import strategies as st

from chatapp.prompting.prompt import PromptBuilder
from chatapp.prompting.tool_blocks import HERMES
from chatapp.prompting.tool_harmony import HARMONY
from chatapp.prompting.tool_llama import LLAMA_JSON
from chatapp.prompting.tool_mistral import MISTRAL_ARGS_WITH_IDS
from chatapp.services.answer_shape import FREE_TEXT, AnswerShape, ShapedAnswer, read_answer
from chatapp.services.streamed_answer import CallArguments, CallBegins, CallEnds, Shown, StreamedContent
from chatapp.tools import ToolSpec

CALL = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
ANSWERS = ["hello there", f"Sure.  \n{CALL}", "a <tool no call", "x\n\n<tool_c", "<tool_call>{cut", f"  lead {CALL}"]


THINKING = "<|channel|>analysis<|message|>Hidden thoughts.<|end|><|start|>assistant"
HARMONY_CALL = '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": "<|en"}'
HARMONY_ANSWERS = {  # an answer, and what the user sees of it
    THINKING + "<|channel|>final<|message|>It is <|en sunny.": "It is <|en sunny.",
    THINKING + "<|channel|>commentary<|message|>Looking.<|end|><|start|>assistant" + HARMONY_CALL: "Looking.",
    " to=functions.f<|channel|>commentary json<|message|>{}": "",
    "<|channel|>final<|message|>Cut <|": "Cut <|",
    "<|chan": "<|chan",  # not harmony after all: plain text
    " told you so": " told you so",
}


TOOLS = AnswerShape(tools=(ToolSpec("f"),))


class HermesBuilder:
    """What StreamedContent and read_answer ask of a builder: its call format."""

    tool_format = HERMES


class HarmonyBuilder:
    tool_format = HARMONY


def streamed_and_read(
    answer: str, builder: object, data: st.DataObject, shape: AnswerShape = TOOLS
) -> tuple[str, str, ShapedAnswer]:
    """`answer` streamed in pieces cut anywhere: what the stream showed, what it showed at the end, the whole read."""
    cuts = sorted(data.draw(st.sets(st.integers(1, len(answer) - 1), max_size=12)))
    pieces = [answer[start:end] for start, end in zip([0, *cuts], [*cuts, len(answer)], strict=True)]
    shown = StreamedContent(shape, cast(PromptBuilder, builder))
    streamed = "".join(shown.feed(piece) for piece in pieces)
    whole = read_answer(answer, shape, cast(PromptBuilder, builder))
    return streamed, shown.rest(whole), whole


@given(answer=st.sampled_from(ANSWERS), data=st.data())
def test_streamed_pieces_join_to_the_whole_answer_however_the_tokens_fall(answer: str, data: st.DataObject) -> None:
    streamed, rest, whole = streamed_and_read(answer, HermesBuilder(), data)
    assert streamed + rest == whole.content
    assert CALL not in streamed, "a call is never streamed as text"


@given(answer=st.sampled_from(sorted(HARMONY_ANSWERS)), tools=st.booleans(), data=st.data())
def test_a_harmony_stream_shows_only_the_reply_and_joins_to_it(answer: str, tools: bool, data: st.DataObject) -> None:
    """gpt-oss, with tools or without: the reasoning and the calls are never streamed; what is, joins to
    the answer's content."""
    streamed, rest, whole = streamed_and_read(answer, HarmonyBuilder(), data, TOOLS if tools else FREE_TEXT)
    assert streamed + rest == whole.content == HARMONY_ANSWERS[answer]
    assert len(whole.calls) == (answer.count("to=functions.f") if tools else 0)


def shown_with_calls(
    answer: str, data: st.DataObject, shape: AnswerShape = TOOLS, builder: object | None = None
) -> tuple[list[Shown], ShapedAnswer, StreamedContent]:
    """Everything a stream shows of `answer` (Hermes calls offered, unless another builder is given), its pieces
    cut anywhere."""
    form = cast(PromptBuilder, builder if builder is not None else HermesBuilder())
    cuts = sorted(data.draw(st.sets(st.integers(1, len(answer) - 1), max_size=12)))
    pieces = [answer[start:end] for start, end in zip([0, *cuts], [*cuts, len(answer)], strict=True)]
    stream = StreamedContent(shape, form)
    shown: list[Shown] = []
    for piece in pieces:
        if text := stream.feed(piece):
            shown.append(text)
        shown += stream.calls()
    whole = read_answer(answer, shape, form)
    if rest := stream.rest(whole):
        shown.append(rest)
    return [*shown, *stream.ending(whole)], whole, stream


def calls_shown(shown: Sequence[Shown]) -> list[tuple[str, str, str, bool]]:
    """Each call a stream showed: its id, name, arguments joined and whether it ended complete."""
    calls: dict[int, tuple[str, str, str, bool]] = {}
    for item in shown:
        if isinstance(item, CallBegins):
            assert item.index == len(calls), "calls are numbered in order"
            calls[item.index] = (item.call_id, item.name, "", False)
        elif isinstance(item, CallArguments):
            call_id, name, written, _ = calls[item.index]
            calls[item.index] = (call_id, name, written + item.text, False)
        elif isinstance(item, CallEnds):
            call_id, name, written, _ = calls[item.index]
            calls[item.index] = (call_id, name, written, item.complete)
    return list(calls.values())


TWO_CALLS = 'Let me look.\n<tool_call>\n{"name": "f", "arguments": {"a": "x}"}}\n</tool_call>\n' + CALL


@given(answer=st.sampled_from([CALL, TWO_CALLS, f"  lead {CALL}"]), data=st.data())
def test_calls_are_shown_as_they_are_written_and_are_the_calls_the_answer_made(
    answer: str, data: st.DataObject
) -> None:
    shown, whole, stream = shown_with_calls(answer, data)
    text = "".join(item for item in shown if isinstance(item, str))
    calls = calls_shown(shown)
    assert text == whole.content
    assert [(name, json.loads(arguments), complete) for _, name, arguments, complete in calls] == [
        (call.name, call.arguments, True) for call in whole.calls
    ]
    assert [call.id for call in stream.as_streamed(whole.calls)] == [call_id for call_id, *_ in calls]
    first_call = next(index for index, item in enumerate(shown) if isinstance(item, CallBegins))
    assert isinstance(shown[first_call + 1], CallArguments), "the name is shown before the call's end"


@given(data=st.data())
def test_a_call_cut_before_its_end_is_shown_begun_and_ended_incomplete(data: st.DataObject) -> None:
    answer = TWO_CALLS[: TWO_CALLS.index('"x}"') + 2]
    shown, whole, _ = shown_with_calls(answer, data)
    assert whole.calls == ()
    assert "".join(item for item in shown if isinstance(item, str)) == "Let me look."
    ((_, name, arguments, complete),) = calls_shown(shown)
    assert (name, arguments, complete) == ("f", '{"a": "x', False)


@given(data=st.data())
def test_a_format_read_whole_shows_its_calls_once_the_answer_ended(data: st.DataObject) -> None:
    answer = HARMONY_CALL + "<|call|>"
    stream = StreamedContent(TOOLS, cast(PromptBuilder, HarmonyBuilder()))
    assert all(not stream.feed(piece) and not stream.calls() for piece in answer)
    whole = read_answer(answer, TOOLS, cast(PromptBuilder, HarmonyBuilder()))
    calls = calls_shown(stream.ending(whole))
    assert [(call_id, name, json.loads(arguments), complete) for call_id, name, arguments, complete in calls] == [
        (call.id, call.name, call.arguments, True) for call in whole.calls
    ]
    assert len(calls) == 1


class MistralBuilder:
    tool_format = MISTRAL_ARGS_WITH_IDS


def test_a_call_keeps_the_id_the_model_wrote_where_its_template_takes_it() -> None:
    """Mistral Small 3.2 writes each call's id before its arguments: the stream announces the call with it
    (a repeated id gets a new one, as the answer read whole gives)."""
    answer = '[TOOL_CALLS]f[CALL_ID]a1b2c3d4e[ARGS]{"a": 1}[TOOL_CALLS]f[CALL_ID]a1b2c3d4e[ARGS]{}'
    builder = cast(PromptBuilder, MistralBuilder())
    stream = StreamedContent(TOOLS, builder)
    assert stream.feed(answer) == ""
    begun = [item for item in stream.calls() if isinstance(item, CallBegins)]
    whole = read_answer(answer, TOOLS, builder)
    assert begun[0].call_id == whole.calls[0].id == "a1b2c3d4e"
    assert begun[1].call_id != "a1b2c3d4e"
    assert MISTRAL_ARGS_WITH_IDS.call_ids.valid(begun[1].call_id)
    assert [call.id for call in stream.as_streamed(whole.calls)] == [item.call_id for item in begun]


class LlamaBuilder:
    tool_format = LLAMA_JSON


LLAMA_CALL = '{"name": "f", "parameters": {"a": "x}"}}'


@given(
    answer=st.sampled_from([LLAMA_CALL, f"  {LLAMA_CALL}", f"Example: {LLAMA_CALL} done", '{"nam']),
    data=st.data(),
)
def test_a_call_that_must_be_the_whole_answer_is_shown_only_where_it_is(answer: str, data: st.DataObject) -> None:
    """Llama 3's call is the whole answer: the same JSON after some text is text, shown as text."""
    cuts = sorted(data.draw(st.sets(st.integers(1, len(answer) - 1), max_size=12)))
    builder = cast(PromptBuilder, LlamaBuilder())
    stream = StreamedContent(TOOLS, builder)
    shown: list[Shown] = []
    for start, end in zip([0, *cuts], [*cuts, len(answer)], strict=True):
        if text := stream.feed(answer[start:end]):
            shown.append(text)
        shown += stream.calls()
    whole = read_answer(answer, TOOLS, builder)
    shown += [stream.rest(whole), *stream.ending(whole)]
    assert "".join(item for item in shown if isinstance(item, str)) == whole.content
    assert [name for _, name, _, _ in calls_shown(shown)] == [call.name for call in whole.calls]


NAMED = AnswerShape(tools=(ToolSpec("read"), ToolSpec("read_file"), ToolSpec("list_dir")))


def announcements(answer: str, shape: AnswerShape = NAMED, builder: object | None = None) -> list[tuple[str, str]]:
    """Each call announced while `answer` is fed a character at a time: the text written by then, and its name."""
    stream = StreamedContent(shape, cast(PromptBuilder, builder if builder is not None else HermesBuilder()))
    found = []
    for end in range(1, len(answer) + 1):
        stream.feed(answer[end - 1])
        found += [(answer[:end], item.name) for item in stream.calls() if isinstance(item, CallBegins)]
    return found


def hermes_call(name: str) -> str:
    return '<tool_call>\n{"name": "' + name + '", "arguments": {"path": "a"}}\n</tool_call>'


def test_a_call_is_announced_as_soon_as_the_grammar_leaves_its_name_one_choice() -> None:
    """The grammar holds the name to the tools': the first letters that fit one function alone name the call."""
    assert announcements(hermes_call("list_dir")) == [('<tool_call>\n{"name": "l', "list_dir")]
    assert announcements(hermes_call("read_file")) == [('<tool_call>\n{"name": "read_', "read_file")]
    # A name that begins another is known once its closing quote is written, and then whole.
    assert announcements(hermes_call("read")) == [('<tool_call>\n{"name": "read"', "read")]
    # One function to call: named as soon as its name begins.
    one = AnswerShape(tools=(ToolSpec("list_dir"),))
    assert announcements(hermes_call("list_dir"), one) == [('<tool_call>\n{"name": "', "list_dir")]


@given(name=st.sampled_from(["read", "read_file", "list_dir"]), data=st.data())
def test_a_call_announced_early_is_shown_once_with_its_whole_arguments(name: str, data: st.DataObject) -> None:
    shown, whole, _ = shown_with_calls("Looking." + hermes_call(name), data, NAMED)
    assert [(found, json.loads(arguments), complete) for _, found, arguments, complete in calls_shown(shown)] == [
        (name, {"path": "a"}, True)
    ]
    assert [call.name for call in whole.calls] == [name]


def test_a_head_that_names_another_function_than_announced_stops_the_reading() -> None:
    """Only without a grammar can the name go on otherwise: the call is then not followed further (the answer's
    end shows what it read), never announced twice."""
    stream = StreamedContent(NAMED, cast(PromptBuilder, HermesBuilder()))
    for char in '<tool_call>\n{"name": "list_files", "arguments": {}}\n</tool_call>':
        stream.feed(char)
    assert [item.name for item in stream.calls() if isinstance(item, CallBegins)] == ["list_dir"]
    assert stream.feed(hermes_call("read")) == ""
    assert stream.calls() == []


@given(data=st.data())
def test_beside_a_response_format_json_that_begins_as_a_call_does_is_not_announced_early(data: st.DataObject) -> None:
    """Tools and a response format (Ollama's `format` beside tools): the grammar also allows the format's JSON,
    which may begin `{"name": "` as Llama 3's call does; only a whole call's head announces a call then."""
    shape = AnswerShape(tools=(ToolSpec("list_dir"),), json_schema='{"type": "object"}')
    answer = '{"name": "list_of_things", "size": 2}'
    shown, whole, _ = shown_with_calls(answer, data, shape, LlamaBuilder())
    assert not [item for item in shown if isinstance(item, CallBegins)]
    assert "".join(item for item in shown if isinstance(item, str)) == whole.content == answer


def test_each_of_several_calls_is_announced_early() -> None:
    first, second = hermes_call("list_dir"), hermes_call("read_file")
    assert announcements(f"{first}\n{second}") == [
        ('<tool_call>\n{"name": "l', "list_dir"),
        (f'{first}\n<tool_call>\n{{"name": "read_', "read_file"),
    ]


def test_names_json_escapes_are_announced_as_the_grammar_spells_them() -> None:
    shape = AnswerShape(tools=(ToolSpec('say "hi"'), ToolSpec("café"), ToolSpec("caf")))
    quoted = '<tool_call>\n{"name": "say \\"hi\\"", "arguments": {}}\n</tool_call>'
    assert [name for _, name in announcements(quoted, shape)] == ['say "hi"']
    assert announcements('<tool_call>\n{"name": "café", "arguments": {}}\n</tool_call>', shape)[0] == (
        '<tool_call>\n{"name": "café',
        "café",
    )


@given(data=st.data())
def test_a_call_cut_right_after_its_early_announcement_ends_incomplete(data: st.DataObject) -> None:
    shown, whole, _ = shown_with_calls('Looking.<tool_call>\n{"name": "l', data, NAMED)
    assert whole.calls == ()
    assert [(name, complete) for _, name, _, complete in calls_shown(shown)] == [("list_dir", False)]
    assert "".join(item for item in shown if isinstance(item, str)) == "Looking."


def test_llamas_whole_answer_call_is_announced_only_once_its_head_is_whole() -> None:
    """Llama 3's call may follow `<|python_tag|>`, which its grammar reads as text: no grammar may hold it."""
    answer = '{"name": "list_dir", "parameters": {}}'
    assert announcements(answer, NAMED, LlamaBuilder()) == [('{"name": "list_dir", "parameters": {', "list_dir")]
