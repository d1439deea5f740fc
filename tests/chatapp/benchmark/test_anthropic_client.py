"""K's streamed answers read back as they compare with a cold run: a call's input, however it was
spelled and cut into pieces, reads as its canonical JSON."""

from __future__ import annotations

from typing import Any, cast

from chatapp.benchmark.anthropic_client import answer_as_shown, read_anthropic_stream
from chatapp.prompting.prompt import PromptBuilder
from chatapp.prompting.tool_blocks import HERMES
from chatapp.services.answer_shape import AnswerShape
from chatapp.tools import ToolSpec

READ = AnswerShape(tools=(ToolSpec("Read"),))
COLD = 'Reading.\n<tool_call>\n{"name": "Read", "arguments": {"path": "a.py", "lines": [1, 2]}}\n</tool_call>'


class HermesBuilder:
    """What answer_as_shown asks of a builder: its call format."""

    tool_format = HERMES


def as_shown(text: str) -> str:
    return answer_as_shown(text, READ, cast(PromptBuilder, HermesBuilder()))


def event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, **fields}


def test_a_call_streamed_in_pieces_reads_as_the_same_answer_computed_whole() -> None:
    written = '{"path": "a.py",  "lines": [1, 2]}'
    pieces = [written[:7], written[7:19], written[19:]]
    events = [
        event("message_start", message={"usage": {"input_tokens": 5, "cache_read_input_tokens": 95}}),
        event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        event("content_block_delta", index=0, delta={"type": "text_delta", "text": "Reading."}),
        event("content_block_stop", index=0),
        event("content_block_start", index=1, content_block={"type": "tool_use", "id": "t", "name": "Read"}),
        *[event("content_block_delta", index=1, delta={"type": "input_json_delta", "partial_json": p}) for p in pieces],
        event("content_block_stop", index=1),
        event("message_delta", usage={"output_tokens": 20}),
    ]
    answer = read_anthropic_stream((float(number), item) for number, item in enumerate(events))
    assert answer.text == as_shown(COLD) == 'Reading.[tool_use Read]{"lines":[1,2],"path":"a.py"}'
    assert answer.ttft_ms == 2000.0, "the first text's time"
    assert (answer.prompt_tokens, answer.computed_tokens) == (100, 5)


def test_a_call_cut_inside_its_input_reads_as_written_and_as_a_cold_run_of_it_shows() -> None:
    events = [
        event("content_block_start", index=0, content_block={"type": "tool_use", "id": "t", "name": "Read"}),
        event("content_block_delta", index=0, delta={"type": "input_json_delta", "partial_json": '{"path": "a'}),
        event("content_block_stop", index=0),
    ]
    answer = read_anthropic_stream((0.5, item) for item in events)
    assert (
        answer.text
        == as_shown('<tool_call>\n{"name": "Read", "arguments": {"path": "a')
        == '[tool_use Read]{"path": "a'
    )
