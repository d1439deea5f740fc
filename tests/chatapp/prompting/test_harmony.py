"""gpt-oss's harmony format: its calls read, held by a grammar, and its tool conversations rendered.

The template is gpt-oss's own (templates/gpt_oss.jinja, byte for byte llama.cpp's
models/templates/openai-gpt-oss-120b.jinja). No gpt-oss model is small enough for the tests:
a tiny model's vocabulary gets harmony's markers as single special tokens instead
(HARMONY_TOKENS), which llama.cpp loads as it loads gpt-oss's own (`<|channel|>` rendered as
text, `<|call|>` and `<|return|>` ending generation). Grammars run in llama.cpp's own sampler.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chatapp.engine.llama_native import NativeModel
from chatapp.prompting.grammar import Grammar
from chatapp.prompting.harmony import CALL_END, END, RETURN
from chatapp.prompting.prompt import ChatMessage, PromptBuilder
from chatapp.prompting.tool_blocks import HERMES
from chatapp.prompting.tool_detection import native_format
from chatapp.prompting.tool_harmony import HARMONY, is_trigger_pattern, trigger_pattern
from chatapp.services.answer_shape import server_grammar
from chatapp.tools import ToolCall, ToolResult, ToolSpec, canonical_json
from chatapp.vocabulary import Role
from tests.grammar_support import grammar_takes as takes
from tests.model_factory import HARMONY_TOKENS, write_tiny_llama

TEMPLATES = Path(__file__).parent / "templates"
GPT_OSS = (TEMPLATES / "gpt_oss.jinja").read_text(encoding="utf-8")
WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city.",
    canonical_json({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
)
TIME = ToolSpec(
    "get_time",
    "The time in some hours.",
    canonical_json({"type": "object", "properties": {"hours": {"type": "integer"}}, "required": ["hours"]}),
)
TOOLS = (WEATHER, TIME)
THOUGHT = "<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant"
WEATHER_CALL = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}'
ROLE_CALL = ' to=functions.get_time<|channel|>commentary json<|message|>{"hours": 2}'  # as the template writes one


@pytest.fixture(scope="module")
def harmony_vocab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NativeModel]:
    path = tmp_path_factory.mktemp("harmony") / "tiny-gpt_oss.gguf"
    write_tiny_llama(path, chat_template=GPT_OSS, special_tokens=HARMONY_TOKENS)
    model = NativeModel(path, vocab_only=True)
    yield model
    model.close()


def test_the_gpt_oss_template_speaks_harmony(harmony_vocab: NativeModel) -> None:
    assert native_format(GPT_OSS, renders_tools=True) is HARMONY
    assert native_format(GPT_OSS, renders_tools=False) is None
    assert native_format((TEMPLATES / "qwen3_style.jinja").read_text(), renders_tools=True) is HERMES
    builder = PromptBuilder.for_model(harmony_vocab)
    assert builder.native_tools, "the template renders each step of a tool conversation"
    assert builder.tool_format is HARMONY


# Reading answers: what the user sees, and the calls.


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (THOUGHT + WEATHER_CALL, "", [("get_weather", {"city": "Oslo"})]),
        (ROLE_CALL, "", [("get_time", {"hours": 2})]),
        (WEATHER_CALL + CALL_END + "<|start|>assistant" + ROLE_CALL, "", [("get_weather", {}), ("get_time", {})]),
        (
            "<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant" + WEATHER_CALL,
            "Let me look.",
            [("get_weather", {"city": "Oslo"})],
        ),
        (THOUGHT + "<|channel|>final<|message|>It is sunny.", "It is sunny.", []),
        ("<|channel|>final<|message|>Hi <|e", "Hi <|e", []),  # a marker's start that ended nothing is text
        ("Plain text, no channels.", "Plain text, no channels.", []),
    ],
)
def test_an_answer_shows_its_reply_and_makes_its_calls(
    text: str, content: str, calls: list[tuple[str, dict[str, object]]]
) -> None:
    parsed = HARMONY.parse(text, TOOLS)
    assert parsed.content == content
    assert [call.name for call in parsed.calls] == [name for name, _ in calls]
    for call, (_, arguments) in zip(parsed.calls, calls, strict=True):
        if arguments:
            assert call.arguments_json == canonical_json(arguments)
    assert parsed.whole


@pytest.mark.parametrize(
    "text",
    [
        THOUGHT + '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": Oslo}',
        THOUGHT + '<|channel|>commentary to=functions.launch <|constrain|>json<|message|>{"city": "Oslo"}',
        THOUGHT + "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>[1]",
        '<|channel|>commentary to=browser.search<|message|>{"query": "Oslo"}',
    ],
)
def test_a_call_that_does_not_parse_or_names_no_tool_is_no_call(text: str) -> None:
    parsed = HARMONY.parse(text, TOOLS)
    assert parsed.calls == ()
    assert parsed.content == "", "neither the reasoning nor the broken call is shown"


def test_an_answer_cut_inside_a_further_call_keeps_the_whole_ones() -> None:
    parsed = HARMONY.parse(
        WEATHER_CALL + CALL_END + '<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{"ho',
        TOOLS,
    )
    assert [call.name for call in parsed.calls] == ["get_weather"]
    assert not parsed.whole


# The grammar, in llama.cpp's own sampler over the harmony vocabulary.


def grammar_takes(vocab: NativeModel, grammar: Grammar, text: str) -> bool:
    """Whether `grammar` lets the model write `text` (its markers as the special tokens a model writes) and stop."""
    (call_end,) = vocab.tokenize(CALL_END, add_special=False, parse_special=True)
    assert vocab.is_end_of_generation(call_end)
    return takes(vocab, grammar, text, call_end)


def test_a_required_call_is_a_call_to_a_tool_with_its_arguments(harmony_vocab: NativeModel) -> None:
    grammar = HARMONY.grammar(TOOLS, parallel=True, lazy=False)
    for text in (WEATHER_CALL, ROLE_CALL, THOUGHT + WEATHER_CALL, THOUGHT + ROLE_CALL):
        assert grammar_takes(harmony_vocab, grammar, text), text
    for text in (
        WEATHER_CALL.replace("get_weather", "get_news"),  # no such tool
        WEATHER_CALL.replace('"city"', '"town"'),  # not its arguments
        ROLE_CALL.replace("2", '"2"'),  # an integer's place
        WEATHER_CALL[:-1],  # unfinished: it may not stop there
        WEATHER_CALL + " And more.",  # the call ends the answer
        "<|channel|>final<|message|>It is sunny.",  # no call at all
        "Sure.",
    ):
        assert not grammar_takes(harmony_vocab, grammar, text), text
    named = HARMONY.grammar((TIME,), parallel=False, lazy=False)
    assert grammar_takes(harmony_vocab, named, ROLE_CALL)
    assert not grammar_takes(harmony_vocab, named, WEATHER_CALL)


def test_beside_a_response_format_the_reply_is_that_json_on_the_final_channel(harmony_vocab: NativeModel) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    grammar = HARMONY.grammar(TOOLS, parallel=False, lazy=True, or_schema=schema)
    assert grammar_takes(harmony_vocab, grammar, WEATHER_CALL)
    assert grammar_takes(harmony_vocab, grammar, THOUGHT + '<|channel|>final<|message|>{"ok": true}')
    assert not grammar_takes(harmony_vocab, grammar, '<|channel|>final<|message|>{"ok": 1}')


def test_a_lazy_grammar_holds_a_call_from_its_header_and_nothing_else(harmony_vocab: NativeModel) -> None:
    """The trigger sees the markers' text (special tokens included), and only a call's header at the
    start of a message sets it off: the same words inside the reasoning are text."""
    grammar = HARMONY.grammar(TOOLS, parallel=False, lazy=True)
    musing = "<|channel|>analysis<|message|>I could write to=functions.get_weather<|channel|>commentary<|message|>{oops"
    header = "<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    assert grammar_takes(harmony_vocab, grammar, musing), "free until a call begins"
    assert grammar_takes(harmony_vocab, grammar, "<|channel|>final<|message|>It is sunny.")
    assert grammar_takes(harmony_vocab, grammar, musing + header + '{"city": "Oslo"}')
    assert not grammar_takes(harmony_vocab, grammar, musing + header + '{"town": "Oslo"}'), "held once it began"
    assert not grammar_takes(harmony_vocab, grammar, musing + header + '{"city": "Oslo"'), "it may not stop inside"
    assert not grammar_takes(harmony_vocab, grammar, ROLE_CALL.replace("2", "two")), "the role's header too"
    unknown = "<|channel|>commentary to=functions.get_news<|message|>{anything"
    assert grammar_takes(harmony_vocab, grammar, unknown), "a header naming no tool is no call to hold"


def test_trigger_patterns_are_taken_back_only_in_the_form_chatapp_writes() -> None:
    """A chatapp in front of this one sends the grammar in llama-server's fields: taken back as it was."""
    grammar = HARMONY.grammar(TOOLS, parallel=False, lazy=True)
    fields = grammar.server_fields()
    triggers = [(trigger["type"], trigger["value"]) for trigger in fields["grammar_triggers"]]
    taken = server_grammar(fields["grammar"], lazy=True, triggers=triggers)
    assert taken.whole_text_patterns() == grammar.whole_text_patterns()
    pattern = trigger_pattern(["get_weather", "odd.name(1)"])
    assert is_trigger_pattern(pattern)
    assert not is_trigger_pattern(pattern.replace("get_weather", "(a+)+", 1))
    assert not is_trigger_pattern(pattern.replace("get_weather", "other", 1)), "the two headers name the same tools"


# Tool conversations with gpt-oss's own template.


def harmony_builder(vocab: NativeModel) -> PromptBuilder:
    return PromptBuilder.for_model(vocab).with_tools(TOOLS)


def text_of(vocab: NativeModel, tokens: list[int]) -> str:
    return vocab.detokenize(tokens, special=True)


def test_a_tool_conversation_is_what_the_template_renders(harmony_vocab: NativeModel) -> None:
    """Message by message, a conversation the client sent whole (no ids known) reads as the template
    renders it in inference (earlier answers end with `<|end|>`)."""
    builder = harmony_builder(harmony_vocab)
    call = ToolCall("call_1", "get_weather", '{"city":"Oslo"}')
    messages = [
        ChatMessage.of(Role.SYSTEM, "Be brief."),
        ChatMessage.of(Role.USER, "Weather in Oslo?"),
        ChatMessage(Role.ASSISTANT, ("",), tool_calls=(call,)),
        ChatMessage(Role.TOOL, (), results=(ToolResult(call.id, call.name, 'sunny, "warm"'),)),
        ChatMessage.of(Role.ASSISTANT, "It is sunny."),
        ChatMessage.of(Role.USER, "Thanks!"),
    ]
    rendered = builder.template.render(
        [item for message in messages for item in message.template_inputs()],
        add_generation_prompt=True,
        tools=[tool.template_input() for tool in TOOLS],
    )
    text = text_of(harmony_vocab, builder.build(messages))
    assert text.removeprefix(harmony_vocab.token_text(harmony_vocab.bos_id)) == rendered
    assert (
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"sunny, \\"warm\\""<|end|>' in text
    )
    assert "<|message|>It is sunny.<|end|><|start|>user" in text
    assert RETURN not in text


def test_a_call_and_its_answer_stay_the_tokens_generated(harmony_vocab: NativeModel) -> None:
    """The agent loop: each prompt begins with the last one and the answer's own tokens (its reasoning
    kept), a call closed by `<|call|>`, an answer by `<|end|>`, as the template closes them."""
    builder = harmony_builder(harmony_vocab)
    history = [ChatMessage.of(Role.SYSTEM, "Be brief."), ChatMessage.of(Role.USER, "Weather in Oslo?")]
    prompt = builder.build(history)
    call_ids = tuple(harmony_vocab.tokenize(THOUGHT + WEATHER_CALL, add_special=False, parse_special=True))
    call = ToolCall("call_1", "get_weather", '{"city":"Oslo"}')
    history += [
        ChatMessage(Role.ASSISTANT, ("",), generated_ids=call_ids, tool_calls=(call,)),
        ChatMessage(Role.TOOL, (), results=(ToolResult(call.id, call.name, "sunny"),)),
    ]
    after_call = builder.build(history)
    assert after_call[: len(prompt) + len(call_ids)] == [*prompt, *call_ids]
    assert text_of(harmony_vocab, after_call[len(prompt) + len(call_ids) :]).startswith(
        CALL_END + "<|start|>functions.get_weather to=assistant"
    )
    answer_ids = tuple(
        harmony_vocab.tokenize(
            THOUGHT + "<|channel|>final<|message|>It is sunny.", add_special=False, parse_special=True
        )
    )
    history += [
        ChatMessage(Role.ASSISTANT, ("It is sunny.",), generated_ids=answer_ids),
        ChatMessage.of(Role.USER, "Thanks"),
    ]
    after_answer = builder.build(history)
    assert after_answer[: len(after_call) + len(answer_ids)] == [*after_call, *answer_ids]
    rest = text_of(harmony_vocab, after_answer[len(after_call) + len(answer_ids) :])
    assert rest == END + "<|start|>user<|message|>Thanks<|end|><|start|>assistant"


def test_a_preamble_sent_back_with_a_call_does_not_rewrite_the_history(harmony_vocab: NativeModel) -> None:
    """The template shows a call's text as reasoning and drops it once an answer follows; given to it,
    the prompt could not grow by appending. The call's ids keep the preamble, when known."""
    builder = harmony_builder(harmony_vocab)
    call = ToolCall("call_1", "get_weather", '{"city":"Oslo"}')
    history = [
        ChatMessage.of(Role.USER, "Weather in Oslo?"),
        ChatMessage(Role.ASSISTANT, ("Let me look.",), tool_calls=(call,)),
        ChatMessage(Role.TOOL, (), results=(ToolResult(call.id, call.name, "sunny"),)),
    ]
    before = builder.build(history)
    later = builder.build(
        [*history, ChatMessage.of(Role.ASSISTANT, "It is sunny."), ChatMessage.of(Role.USER, "Thanks")]
    )
    assert later[: len(before)] == before
    assert text_of(harmony_vocab, later).count("<|start|>system") == 1


def test_an_answer_kept_with_its_channels_goes_on_as_generated(harmony_vocab: NativeModel) -> None:
    """The chat screen keeps an answer as generated, channels and all: the next prompt still renders (the
    template refuses channel markers in content) and begins with the answer's own tokens."""
    builder = PromptBuilder.for_model(harmony_vocab)
    history = [ChatMessage.of(Role.USER, "Weather in Oslo?")]
    prompt = builder.build(history)
    raw = THOUGHT + "<|channel|>final<|message|>It is sunny."
    answer_ids = tuple(harmony_vocab.tokenize(raw, add_special=False, parse_special=True))
    history += [ChatMessage(Role.ASSISTANT, (raw,), generated_ids=answer_ids), ChatMessage.of(Role.USER, "Thanks")]
    following = builder.build(history)
    assert following[: len(prompt) + len(answer_ids)] == [*prompt, *answer_ids]
    assert text_of(harmony_vocab, following).endswith("<|start|>user<|message|>Thanks<|end|><|start|>assistant")
