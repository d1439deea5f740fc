"""What a stream shows of an answer that may turn into calls: its pieces join to the whole answer's text."""

from __future__ import annotations

from typing import cast

from hypothesis import given
from hypothesis import strategies as st

from chatapp.engine.prompt import PromptBuilder
from chatapp.engine.tool_blocks import HERMES
from chatapp.services.answer_shape import AnswerShape, StreamedContent, read_answer
from chatapp.tools import ToolSpec

CALL = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
ANSWERS = ["hello there", f"Sure.  \n{CALL}", "a <tool no call", "x\n\n<tool_c", "<tool_call>{cut", f"  lead {CALL}"]


class HermesBuilder:
    """What StreamedContent and read_answer ask of a builder: its call format."""

    tool_format = HERMES


@given(answer=st.sampled_from(ANSWERS), data=st.data())
def test_streamed_pieces_join_to_the_whole_answer_however_the_tokens_fall(answer: str, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.sets(st.integers(1, len(answer) - 1), max_size=8)))
    pieces = [answer[start:end] for start, end in zip([0, *cuts], [*cuts, len(answer)], strict=True)]
    shape = AnswerShape(tools=(ToolSpec("f"),))
    builder = cast(PromptBuilder, HermesBuilder())
    shown = StreamedContent(shape, builder)
    streamed = "".join(shown.feed(piece) for piece in pieces)
    whole = read_answer(answer, shape, builder)
    assert streamed + shown.rest(whole) == whole.content
    assert CALL not in streamed, "a call is never streamed as text"
