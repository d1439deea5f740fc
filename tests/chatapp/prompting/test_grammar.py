"""Grammars in the engine: an answer held to a tool call or to JSON is the same cold and from the cache.

Tiny random models with a Qwen3-style template (calls as `<tool_call>` JSON), a
Qwen3-Coder-style one (calls as `<function=...>` parameter blocks), a Llama-3-style one and
Mistral's own templates (`[TOOL_CALLS]`, its markers special tokens of the tiny model's
vocabulary as of Mistral's), all rendering the tools themselves: their answers are gibberish,
but a grammar makes them calls and JSON all the same, and a grammar only masks tokens, so a
cache hit must give the very tokens a cold run gives.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatapp.engine.engine import Engine, EngineConfig
from chatapp.engine.events import GenerationResult
from chatapp.engine.llama_native import NativeModel
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.errors import GrammarError
from chatapp.prompting.grammar import Grammar
from chatapp.prompting.json_grammar import schema_grammar
from chatapp.prompting.prompt import ChatMessage, ModelVocabulary, PromptBuilder
from chatapp.prompting.tool_blocks import HermesToolFormat, XmlToolFormat
from chatapp.prompting.tool_harmony import HarmonyToolFormat
from chatapp.prompting.tool_llama import LlamaJsonToolFormat
from chatapp.prompting.tool_mistral import MistralArgsToolFormat, MistralJsonToolFormat
from chatapp.tools import ToolCall, ToolResult, ToolSpec, canonical_json
from chatapp.vocabulary import Role
from tests.grammar_support import grammar_takes
from tests.model_factory import HARMONY_TOKENS, MISTRAL_SPECIAL_TOKENS, TINY_MODEL_THREADS, write_tiny_llama

TEMPLATES = Path(__file__).parent / "templates"
WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city.",
    canonical_json(
        {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
    ),
)
TIME = ToolSpec(
    "get_time",
    "The time in some hours.",
    canonical_json(
        {
            "type": "object",
            "properties": {"hours": {"type": "integer"}, "exact": {"type": "boolean"}},
            "required": ["hours"],
        }
    ),
)
FORMATS = {
    "qwen3_style": HermesToolFormat,
    "qwen3_coder_style": XmlToolFormat,
    "llama3_tools_style": LlamaJsonToolFormat,
    "mistral_nemo": MistralJsonToolFormat,
    "mistral_small_3_2": MistralArgsToolFormat,
    "ministral_3": MistralArgsToolFormat,
    "gpt_oss": HarmonyToolFormat,  # gpt-oss's own template, its markers single tokens (HARMONY_TOKENS)
}
MISTRAL_FAMILIES = ("mistral_nemo", "mistral_small_3_2", "ministral_3")
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", params=sorted(FORMATS))
def qwen_engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    template = (TEMPLATES / f"{request.param}.jinja").read_text()
    markers: tuple[str, ...] | dict[int, str] = MISTRAL_SPECIAL_TOKENS if request.param in MISTRAL_FAMILIES else ()
    if request.param == "gpt_oss":
        markers = dict(HARMONY_TOKENS)
    path = write_tiny_llama(
        tmp_path_factory.mktemp("qwen") / f"tiny-{request.param}.gguf", chat_template=template, special_tokens=markers
    )
    config = EngineConfig(model_path=path, context_cap=1024, sequences=2, threads=TINY_MODEL_THREADS)
    with Engine(config) as engine:
        yield engine


def family_of(engine: Engine) -> str:
    """Which template the tiny model was written with (its file is named after it)."""
    assert engine.info.path is not None
    return engine.info.path.stem.removeprefix("tiny-")


def builder(engine: Engine) -> PromptBuilder:
    assert engine.prompt_builder is not None
    return engine.prompt_builder


def answer(engine: Engine, prompt: list[int], grammar: Grammar | None, *, use_cache: bool = True) -> tuple[int, ...]:
    return generated(engine, prompt, grammar, use_cache=use_cache).token_ids


def generated(
    engine: Engine, prompt: list[int], grammar: Grammar | None, *, use_cache: bool = True
) -> GenerationResult:
    """The answer's ids and its text as the engine shows it (a grammar's preserved markers in it)."""
    sampling = SamplingParams(temperature=0, max_tokens=96, grammar=grammar)
    return engine.generate(GenerationRequest(tuple(prompt), sampling, use_cache=use_cache)).wait()


def test_the_template_renders_the_tools_itself(qwen_engine: Engine) -> None:
    tools = builder(qwen_engine).with_tools((WEATHER,))
    assert tools.native_tools
    assert type(tools.tool_format) is FORMATS[family_of(qwen_engine)]
    text = qwen_engine.detokenize(tools.build([ChatMessage.of(Role.USER, "hi")]))
    assert text.count("get_weather") == 1, "the template's own tools block, not a taught one beside it"


def test_grammars_give_calls_and_json_that_parse_the_same_cold_and_from_the_cache(qwen_engine: Engine) -> None:
    question = "What is the weather in Oslo?"
    tools = builder(qwen_engine).with_tools((WEATHER, TIME))
    prompt = tools.build([ChatMessage.of(Role.SYSTEM, "Be brief."), ChatMessage.of(Role.USER, question)])
    grammars = {
        "required": tools.tool_format.grammar((WEATHER, TIME), parallel=False, lazy=False),
        "named": tools.tool_format.grammar((TIME,), parallel=False, lazy=False),
        "auto": tools.tool_format.grammar((WEATHER, TIME), parallel=True, lazy=True),
        "json": schema_grammar(SCHEMA, "response_format"),
    }
    if family_of(qwen_engine) == "gpt_oss":  # a random model may think on past max_tokens first: held to the call
        for name in ("required", "named"):
            grammars[name] = replace(grammars[name], root="chatapp-call")
    for name, grammar in grammars.items():
        result = generated(qwen_engine, prompt, grammar, use_cache=False)
        cold = result.token_ids
        first = answer(qwen_engine, prompt, grammar)
        cached = answer(qwen_engine, prompt, grammar)  # the prompt is resident now: a hit
        assert first == cold, name
        assert cached == cold, name
        text = result.text
        if name == "json":
            value = json.loads(text)
            assert set(value) == {"ok", "n"}
        elif name != "auto":
            parsed = tools.tool_format.parse(text, (WEATHER, TIME))
            assert len(parsed.calls) == 1
            call = parsed.calls[0]
            assert call.name == "get_time" if name == "named" else call.name in ("get_weather", "get_time")
            arguments = json.loads(call.arguments_json)
            if call.name == "get_time":
                assert isinstance(arguments["hours"], int), "typed by the schema"
                assert isinstance(arguments.get("exact", False), bool)
            else:
                assert isinstance(arguments["city"], str)
                assert len(arguments["city"]) <= 12


def test_a_call_and_its_results_extend_the_prompt_it_was_generated_after(qwen_engine: Engine) -> None:
    """The agent loop's next prompt begins with the last prompt and the call's own tokens."""
    tools = builder(qwen_engine).with_tools((WEATHER, TIME))
    history = [ChatMessage.of(Role.SYSTEM, "Be brief."), ChatMessage.of(Role.USER, "Weather in Oslo and Rome?")]
    prompt = tools.build(history)
    grammar = tools.tool_format.grammar((WEATHER,), parallel=True, lazy=False)
    if family_of(qwen_engine) == "gpt_oss":  # a random model may think on for ever first: held to the call itself
        grammar = replace(grammar, root="chatapp-call")
    result = generated(qwen_engine, prompt, grammar)
    ids = result.token_ids
    parsed = tools.tool_format.parse(result.text, (WEATHER,))
    assert parsed.calls
    made = tuple(ToolCall(f"call_{index}", call.name, call.arguments_json) for index, call in enumerate(parsed.calls))
    calls = (*made, ToolCall("call_extra", "get_time", '{"hours":2}'))  # two results at least, whatever the model made
    results = tuple(ToolResult(call.id, call.name, f"result {index}") for index, call in enumerate(calls))
    follow_up = [
        *history,
        ChatMessage(Role.ASSISTANT, ("",), generated_ids=ids, tool_calls=calls),
        ChatMessage(Role.TOOL, (), results=results),
    ]
    next_prompt = tools.build(follow_up)
    assert next_prompt[: len(prompt) + len(ids)] == [*prompt, *ids]
    text = qwen_engine.detokenize(next_prompt[len(prompt) + len(ids) :])  # special tokens left out
    if family_of(qwen_engine) == "llama3_tools_style":
        assert text.count("ipython") == len(calls), "Llama gives each result an ipython turn"
    elif family_of(qwen_engine) in MISTRAL_FAMILIES:
        (results_marker,) = qwen_engine.tokenize("[TOOL_RESULTS]", add_special=False, parse_special=True)
        assert next_prompt.count(results_marker) == len(calls), "Mistral's templates give each result its own"
    elif family_of(qwen_engine) == "gpt_oss":
        assert text.count(" to=assistant<|channel|>commentary") == len(calls), "a message from the function each"
    else:
        assert text.count("user\n") == 1, "consecutive results share one user turn"
    places = [text.index(f"result {index}") for index in range(len(calls))]
    assert places == sorted(places)


def test_reasoning_stays_in_the_history_as_generated(qwen_engine: Engine) -> None:
    """The template drops an earlier answer's <think> block; the answer's own ids keep it (and the cache)."""
    base = builder(qwen_engine)
    thought = "<think>\nThe user greets me.\n</think>\n\nHello!"
    ids = tuple(qwen_engine.tokenize(thought))
    history = [ChatMessage.of(Role.USER, "Hi")]
    prompt = base.build(history)
    follow_up = [*history, ChatMessage(Role.ASSISTANT, (thought,), generated_ids=ids), ChatMessage.of(Role.USER, "Bye")]
    assert base.build(follow_up)[: len(prompt) + len(ids)] == [*prompt, *ids]
    rendered = base.template.render(
        [item for message in follow_up for item in message.template_inputs()], add_generation_prompt=True
    )
    if family_of(qwen_engine) == "qwen3_style":  # Qwen 3's way; the coder-style template keeps it
        assert "<think>" not in rendered, "the template alone would have dropped it (a miss from the first answer on)"


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}, "minimum"),
        ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems"),
        ({"type": "object", "properties": {"x": {"not": {"type": "null"}}}}, "not"),
    ],
)
def test_what_a_grammar_cannot_enforce_is_refused_by_name(schema: dict[str, object], keyword: str) -> None:
    with pytest.raises(GrammarError, match=keyword):
        schema_grammar(schema, "response_format")


def test_a_property_named_like_a_keyword_is_no_keyword() -> None:
    schema = {"type": "object", "properties": {"minimum": {"type": "integer"}, "not": {"type": "string"}}}
    assert "chatapp-root ::=" in schema_grammar(schema, "response_format").gbnf


def test_the_tools_block_comes_once_when_the_template_rewrites_history(qwen_engine: Engine) -> None:
    """A new question makes a Qwen3-style template drop an earlier answer's reasoning (not prefix-stable):
    the message rendered on its own then must not bring the tools block a second time."""
    tools = builder(qwen_engine).with_tools((WEATHER,))
    history = [
        ChatMessage.of(Role.USER, "Hi"),
        ChatMessage.of(Role.ASSISTANT, "<think>\nhm\n</think>\n\nHello"),
        ChatMessage.of(Role.USER, "Weather?"),
    ]
    text = qwen_engine.detokenize(tools.build(history))
    assert text.count("get_weather") == 1, "the tools are shown once"


GRAMMAR_KINDS = ("required", "named", "auto", "json")
words = st.lists(st.sampled_from(["weather", "time", "Oslo", "now", "please", "tell", "me", "a", "long", "story"]))


@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    question=words.map(" ".join).filter(bool),
    kind=st.sampled_from(GRAMMAR_KINDS),
    persona=st.booleans(),
    parallel=st.booleans(),
)
def test_a_grammar_never_makes_a_cached_answer_unlike_the_cold_one(
    qwen_engine: Engine, question: str, kind: str, persona: bool, parallel: bool
) -> None:
    """Property: any question, any grammar, with or without a persona; the answer from the cache
    (the prompt resident, or restored) is the cold answer, token for token."""
    tools = builder(qwen_engine).with_tools((WEATHER, TIME))
    history = [ChatMessage.of(Role.SYSTEM, "Be brief.")] if persona else []
    prompt = tools.build([*history, ChatMessage.of(Role.USER, question)])
    form = tools.tool_format
    grammar = {
        "required": lambda: form.grammar((WEATHER, TIME), parallel=parallel, lazy=False),
        "named": lambda: form.grammar((TIME,), parallel=False, lazy=False),
        "auto": lambda: form.grammar((WEATHER, TIME), parallel=parallel, lazy=True),
        "json": lambda: schema_grammar(SCHEMA, "response_format"),
    }[kind]()
    cold = answer(qwen_engine, prompt, grammar, use_cache=False)
    assert answer(qwen_engine, prompt, grammar) == cold
    assert answer(qwen_engine, prompt, grammar) == cold


REFUSES_TOOLS_WITHOUT_A_QUESTION = (
    "{%- if tools and not (messages | selectattr('role', 'equalto', 'user') | list) -%}"
    "{{- raise_exception('tools need a user message') -}}{%- endif -%}"
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if tools -%}{{- '<tool_call>' + (tools | tojson) -}}{%- endif -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
RESULT_AS_IT_IS = "'\\n<tool_response>\\n' + message.content + '\\n</tool_response>'"
RESULT_AS_JSON = "'\\n<tool_response>\\n' + (message.content | tojson) + '\\n</tool_response>'"


def test_a_template_that_prints_the_system_message_only_with_the_first_question_speaks_its_own_format(
    qwen_engine: Engine,
) -> None:
    """Llama 3.1's template refuses tools before a user message (it puts them in that message): the
    builder prints the system message together with the first question, and the prompt is the
    template's own, text for text."""
    source = builder(qwen_engine)
    waiting = PromptBuilder(replace(source.template, source=REFUSES_TOOLS_WITHOUT_A_QUESTION), source.tokenizer)
    assert waiting.native_tools
    tools = waiting.with_tools((WEATHER,))
    messages = [ChatMessage.of(Role.SYSTEM, "Be brief."), ChatMessage.of(Role.USER, "Hi")]
    vocabulary = cast(ModelVocabulary, source.tokenizer)
    built = "".join(vocabulary.token_text(token) for token in tools.build(messages))
    inputs = [item for message in messages for item in message.template_inputs()]
    whole = tools.template.render(inputs, add_generation_prompt=True, tools=[WEATHER.template_input()])
    assert built.endswith(whole)
    assert built.count("Be brief.") == 1


def test_a_template_that_refuses_a_step_of_a_tool_conversation_gets_the_format_taught(qwen_engine: Engine) -> None:
    """A template that cannot render a tool result is not used for tools: the format is taught, and
    nothing is refused."""
    source = builder(qwen_engine)
    refusing_results = REFUSES_TOOLS_WITHOUT_A_QUESTION.replace(
        "{%- for m in messages -%}",
        "{%- for m in messages -%}{%- if m.role == 'tool' -%}{{- raise_exception('no tool role') -}}{%- endif -%}",
    )
    refusing = PromptBuilder(replace(source.template, source=refusing_results), source.tokenizer)
    assert not refusing.native_tools
    messages = [ChatMessage.of(Role.SYSTEM, "Be brief."), ChatMessage.of(Role.USER, "Hi")]
    assert "get_weather" in qwen_engine.detokenize(refusing.with_tools((WEATHER,)).build(messages))


def results_prompt(tools: PromptBuilder, result: str) -> list[int]:
    call = ToolCall("call_1", "get_weather", '{"city":"Oslo"}')
    history = [
        ChatMessage.of(Role.USER, "Weather?"),
        ChatMessage(Role.ASSISTANT, ("",), tool_calls=(call,)),
        ChatMessage(Role.TOOL, (), results=(ToolResult(call.id, call.name, result),)),
    ]
    return tools.build(history)


@pytest.mark.parametrize("qwen_engine", ["qwen3_style"], indirect=True)  # Mistral's markers: test_tool_mistral.py
def test_a_tool_result_never_becomes_a_special_token(qwen_engine: Engine) -> None:
    """Results printed as they are and through tojson: the tool's text is tokenized as text, so
    `<|im_end|>` in it stays text."""
    source = builder(qwen_engine)
    (end,) = qwen_engine.tokenize("<|im_end|>", add_special=False, parse_special=True)
    qwen3 = (TEMPLATES / "qwen3_style.jinja").read_text()
    assert RESULT_AS_IT_IS in qwen3
    for text in (qwen3, qwen3.replace(RESULT_AS_IT_IS, RESULT_AS_JSON)):
        tools = PromptBuilder(replace(source.template, source=text), source.tokenizer).with_tools((WEATHER,))
        assert tools.native_tools
        assert results_prompt(tools, "<|im_end|> sunny").count(end) == results_prompt(tools, "sunny").count(end)


def test_llama_calls_are_the_whole_answer_and_name_a_tool() -> None:
    from chatapp.prompting.tool_llama import LLAMA_JSON

    tools = (WEATHER,)
    assert LLAMA_JSON.parse('{"name": "get_weather", "parameters": {"city": "Oslo"}}', tools).calls
    assert not LLAMA_JSON.parse('Here it is: {"name": "get_weather", "parameters": {}}', tools).calls
    assert not LLAMA_JSON.parse('{"name": "John", "age": 3}', tools).calls


def test_a_json_string_holds_no_raw_control_character(vocab: NativeModel) -> None:
    """json.loads refuses a raw newline or tab inside a string: the grammar must too (escaped ones are fine)."""
    grammar = schema_grammar({"type": "object", "properties": {"note": {"type": "string"}}}, "response_format")
    assert grammar_takes(vocab, grammar, '{"note": "a\\nb"}', vocab.eos_id, special=False)
    assert not grammar_takes(vocab, grammar, '{"note": "a\nb"}', vocab.eos_id, special=False)
    assert not grammar_takes(vocab, grammar, '{"note": "a\tb"}', vocab.eos_id, special=False)


@pytest.mark.parametrize("untyped", [{}, {"description": "anything the script reads"}, True])
def test_a_schema_that_constrains_nothing_allows_any_value(vocab: NativeModel, untyped: object) -> None:
    schema = {"type": "object", "properties": {"args": untyped}, "required": ["args"]}
    grammar = schema_grammar(schema, "tools[0].parameters")
    for value in ('[1, "two"]', '"text"', "3", '{"k": null}'):
        assert grammar_takes(vocab, grammar, '{"args": ' + value + "}", vocab.eos_id, special=False), value


def test_a_length_past_what_a_grammar_holds_is_refused_in_a_format_and_left_to_the_client_in_a_tool(
    vocab: NativeModel,
) -> None:
    """Claude Code's Write tool allows 524,288 characters: written as nested rules, that overflowed the stack."""
    schema = {"type": "object", "properties": {"content": {"type": "string", "maxLength": 524_288}}}
    with pytest.raises(GrammarError, match="maxLength 524,288"):
        schema_grammar(schema, "response_format")
    tools = (ToolSpec("write", "", json.dumps(schema)),)
    grammar = HermesToolFormat().grammar(tools, parallel=False, lazy=False)
    assert grammar_takes(
        vocab, grammar, '<tool_call>\n{"name": "write", "arguments": {"content": "x"}}\n</tool_call>', vocab.eos_id
    )


@pytest.mark.parametrize(
    ("schema", "taken", "refused"),
    [
        ({"minLength": 2}, '"ab"', "3"),
        ({"items": {"type": "integer"}}, "[1, 2]", '"ab"'),
        ({"required": ["k"], "properties": {"k": {"type": "integer"}}}, '{"k": 1}', "[1]"),
    ],
    ids=["string", "array", "object"],
)
def test_a_schema_without_a_type_has_the_one_its_keywords_imply(
    vocab: NativeModel, schema: dict[str, object], taken: str, refused: str
) -> None:
    grammar = schema_grammar({"type": "object", "properties": {"v": schema}, "required": ["v"]}, "tools[0].parameters")
    assert grammar_takes(vocab, grammar, '{"v": ' + taken + "}", vocab.eos_id, special=False)
    assert not grammar_takes(vocab, grammar, '{"v": ' + refused + "}", vocab.eos_id, special=False)


TREE = {  # a Pydantic model that holds a list of itself
    "$defs": {
        "Node": {
            "type": "object",
            "properties": {
                "value": {"type": "integer"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
            },
            "required": ["value", "children"],
        }
    },
    "$ref": "#/$defs/Node",
}
LINKED = {  # the whole schema refers to itself
    "type": "object",
    "properties": {"value": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
    "required": ["value", "next"],
}


@pytest.mark.parametrize(
    ("schema", "taken", "refused"),
    [
        (
            TREE,
            '{"value": 1, "children": [{"value": 2, "children": [{"value": 3, "children": []}]}]}',
            '{"value": 1, "children": [{"value": 2}]}',
        ),
        (LINKED, '{"value": 1, "next": {"value": 2, "next": null}}', '{"value": 1, "next": {"value": 2}}'),
    ],
    ids=["defs", "root"],
)
def test_a_schema_that_refers_to_itself_holds_at_every_depth(
    vocab: NativeModel, schema: dict[str, object], taken: str, refused: str
) -> None:
    grammar = schema_grammar(schema, "response_format.json_schema.schema")
    assert grammar_takes(vocab, grammar, taken, vocab.eos_id, special=False)
    assert not grammar_takes(vocab, grammar, refused, vocab.eos_id, special=False)


def test_two_tools_with_the_same_defs_name_keep_their_own_shapes(vocab: NativeModel) -> None:
    def tool(name: str, field: str) -> ToolSpec:
        defs = {"Item": {"type": "object", "properties": {field: {"type": "integer"}}, "required": [field]}}
        return ToolSpec(
            name,
            "",
            json.dumps(
                {
                    "$defs": defs,
                    "type": "object",
                    "properties": {"item": {"$ref": "#/$defs/Item"}},
                    "required": ["item"],
                }
            ),
        )

    grammar = HermesToolFormat().grammar((tool("a", "x"), tool("b", "y")), parallel=False, lazy=False)

    def call(name: str, field: str) -> str:
        return f'<tool_call>\n{{"name": "{name}", "arguments": {{"item": {{"{field}": 1}}}}}}\n</tool_call>'

    assert grammar_takes(vocab, grammar, call("a", "x"), vocab.eos_id)
    assert grammar_takes(vocab, grammar, call("b", "y"), vocab.eos_id)
    assert not grammar_takes(vocab, grammar, call("b", "x"), vocab.eos_id)


def test_a_reference_to_nothing_or_outside_the_schema_is_refused_by_name() -> None:
    with pytest.raises(GrammarError, match="'#/\\$defs/Missing', which names nothing"):
        schema_grammar({"$ref": "#/$defs/Missing"}, "response_format")
    for elsewhere in ("https://example.com/schema.json", "#Node"):
        with pytest.raises(GrammarError, match="only references inside the schema by path"):
            schema_grammar({"$ref": elsewhere}, "response_format")


def test_references_whose_names_read_alike_keep_their_own_rules(vocab: NativeModel) -> None:
    defs = {"a_b": {"type": "string"}, "a-b": {"type": "integer"}}
    properties = {"s": {"$ref": "#/$defs/a_b"}, "i": {"$ref": "#/$defs/a-b"}}
    grammar = schema_grammar({"$defs": defs, "type": "object", "properties": properties, "required": ["s", "i"]}, "x")
    assert grammar_takes(vocab, grammar, '{"s": "t", "i": 3}', vocab.eos_id, special=False)
    assert not grammar_takes(vocab, grammar, '{"s": 3, "i": 3}', vocab.eos_id, special=False)


def test_a_parameter_that_refers_to_the_root_definitions_holds_in_the_xml_format(vocab: NativeModel) -> None:
    """Qwen3-Coder's parameter blocks: each parameter's schema is converted alone, its `$ref`s with it."""
    parameters = {
        "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
        "type": "object",
        "properties": {"at": {"$ref": "#/$defs/Point"}},
        "required": ["at"],
    }
    grammar = XmlToolFormat().grammar((ToolSpec("move", "", json.dumps(parameters)),), parallel=False, lazy=False)

    def call(value: str) -> str:
        return f"<tool_call>\n<function=move>\n<parameter=at>\n{value}\n</parameter>\n</function>\n</tool_call>"

    assert grammar_takes(vocab, grammar, call('{"x": 3}'), vocab.eos_id)
    assert not grammar_takes(vocab, grammar, call('{"y": 3}'), vocab.eos_id)


@pytest.mark.parametrize("others", [True, {"type": "integer"}])
def test_other_keys_beside_optional_properties_come_after_a_comma_and_only_if_wanted(
    vocab: NativeModel, others: object
) -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}, "c": {"type": "string"}},
        "additionalProperties": others,
    }
    grammar = schema_grammar(schema, "response_format")
    for taken in ("{}", '{"a": "x"}', '{"a": "x", "c": "y"}', '{"a": "x", "b": 1}', '{"a": "x", "c": "y", "b": 1}'):
        assert grammar_takes(vocab, grammar, taken, vocab.eos_id, special=False), taken
    assert not grammar_takes(vocab, grammar, '{"a": "x" "b": 1}', vocab.eos_id, special=False)
