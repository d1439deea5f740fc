"""What a stream shows of an answer that may turn into calls: its pieces join to the whole answer's text."""

from __future__ import annotations

from typing import cast

from hypothesis import given
from hypothesis import strategies as st

from chatapp.prompting.prompt import PromptBuilder
from chatapp.prompting.tool_blocks import HERMES
from chatapp.prompting.tool_harmony import HARMONY
from chatapp.services.answer_shape import FREE_TEXT, AnswerShape, ShapedAnswer, StreamedContent, read_answer
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
