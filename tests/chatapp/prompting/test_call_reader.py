"""Calls read while they are written: however the answer's pieces fall, the names come once and the
arguments' pieces join to the arguments the model wrote."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from chatapp.prompting.call_reader import (
    ArgumentsWritten,
    CallNamed,
    CallNews,
    CallWritten,
    JsonCallReader,
    JsonValueEnd,
)
from chatapp.prompting.tool_blocks import CALL_OPEN, HERMES
from chatapp.prompting.tool_llama import LLAMA_JSON
from chatapp.prompting.tool_mistral import MistralArgsToolFormat

TRICKY = {"text": 'a "quoted" } ] { [ brace\\', "n": [1, {"deep": None}], "ok": True, "x": -2.5e3}
ARGUMENTS = [json.dumps(TRICKY), json.dumps(TRICKY, indent=2), "{}", '{"city": "Rome"}']


def pieces_of(text: str, data: st.DataObject) -> list[str]:
    """`text` cut anywhere, as tokens might fall."""
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=16)))
    return [text[start:end] for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True) if start < end]


def read(reader: JsonCallReader, pieces: list[str]) -> list[tuple[str, str, bool]]:
    """Each call read: its name, its arguments joined, whether they were seen complete."""
    calls: list[tuple[str, str, bool]] = []
    news: list[CallNews] = [item for piece in pieces for item in reader.feed(piece)]
    for item in news:
        if isinstance(item, CallNamed):
            calls.append((item.name, "", False))
        elif isinstance(item, ArgumentsWritten):
            name, written, _ = calls[-1]
            calls[-1] = (name, written + item.text, False)
        elif isinstance(item, CallWritten):
            calls[-1] = (calls[-1][0], calls[-1][1], True)
    return calls


@given(arguments=st.sampled_from(ARGUMENTS), several=st.integers(1, 3), data=st.data())
def test_hermes_blocks_are_read_as_written_however_the_pieces_fall(
    arguments: str, several: int, data: st.DataObject
) -> None:
    block = f'{CALL_OPEN}\n{{"name": "get_\\"weather", "arguments": {arguments}}}\n</tool_call>'
    answer = "\n".join([block] * several)
    calls = read(HERMES.call_reader(), pieces_of(answer, data))
    assert calls == [('get_"weather', arguments, True)] * several
    assert [json.loads(written) for _, written, _ in calls] == [json.loads(arguments)] * several


@given(data=st.data())
def test_a_cut_call_is_named_and_its_arguments_so_far_are_a_beginning_of_them(data: st.DataObject) -> None:
    arguments = json.dumps(TRICKY)
    answer = f'{{"name": "f", "parameters": {arguments}}}'
    cut = data.draw(st.integers(len('{"name": "f", "parameters": ') + 1, len(answer) - 2))
    calls = read(LLAMA_JSON.call_reader(), pieces_of(answer[:cut], data))
    ((name, written, complete),) = calls
    assert name == "f"
    assert arguments.startswith(written)
    assert complete == (len(written) == len(arguments))


def test_no_call_is_named_before_its_name_and_arguments_key_are_complete() -> None:
    reader = JsonCallReader(CALL_OPEN)
    assert reader.feed('<tool_call>\n{"name": "get_wea') == []
    assert reader.feed('ther", "arguments": ') == []  # the arguments' first character is not written yet
    assert reader.feed('{"c') == [CallNamed("get_weather"), ArgumentsWritten('{"c')]


def test_text_that_holds_no_call_head_is_never_read_as_one() -> None:
    reader = JsonCallReader(CALL_OPEN)
    assert reader.feed('<tool_call>{"arguments": {}, "name": "f"}</tool_call>') == []
    assert reader.feed(" " * 5000 + '<tool_call>{"name": "f", "arguments": {}}') == [], "a reader that gave up stays so"


@given(data=st.data())
def test_a_value_ends_where_json_says(data: st.DataObject) -> None:
    for value, after in [('"a\\"}"', ", rest"), ("[1, [2], {}]", "}"), ("-12.5", "}"), ("true", " "), ("{}", "")]:
        finder, consumed = JsonValueEnd(), 0
        end = None
        for piece in pieces_of(value + after, data):
            end = finder.feed(piece)
            if end is not None:
                consumed += end
                break
            consumed += len(piece)
        assert end is not None, value
        assert consumed == len(value), value


@given(data=st.data())
def test_mistral_calls_are_read_as_written_with_the_ids_the_model_wrote(data: st.DataObject) -> None:
    answer = f"[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{ARGUMENTS[0]}[TOOL_CALLS]get_time[ARGS]{{}}"
    reader = MistralArgsToolFormat(with_ids=True).call_reader()
    news = [item for piece in pieces_of(answer, data) for item in reader.feed(piece)]
    assert [item for item in news if isinstance(item, CallNamed)] == [
        CallNamed("get_weather", "a1b2c3d4e"),
        CallNamed("get_time"),
    ]
    assert read(MistralArgsToolFormat(with_ids=False).call_reader(), pieces_of(answer, data)) == [
        ("get_weather", ARGUMENTS[0], True),
        ("get_time", "{}", True),
    ]
