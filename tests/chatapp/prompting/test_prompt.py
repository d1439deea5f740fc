"""The append-only property of prompts, on SmolLM2's own template and three other families.

Tokens come from the bundled model's real vocabulary; the other families' templates are
their published template strings (tests/chatapp/prompting/templates), with their own
special-token strings.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chatapp.engine.llama_native import NativeModel
from chatapp.prompting.chat_template import ChatTemplate
from chatapp.prompting.prompt import ChatMessage, PromptBuilder
from chatapp.reasoning import REASONING_OFF, Reasoning
from chatapp.vocabulary import Role

TEMPLATES = Path(__file__).parent / "templates"
OTHER_FAMILIES = {
    "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
    "gemma2": ("<bos>", "<eos>"),
    "mistral": ("<s>", "</s>"),
    "mistral_nemo": ("<s>", "</s>"),  # its system message shows in the latest question only: folded instead
    "mistral_small_3_2": ("<s>", "</s>"),
    "ministral_3": ("<s>", "</s>"),
    "gpt_oss": ("<|startoftext|>", "<|return|>"),  # its answers end in <|return|> or <|end|> by what follows
}
ANSWERS = [
    "Paris is the capital of France.",
    " Sure!  Here is some code:\n```python\nprint('hi')\n```\n",
    "Yes.",
]
QUESTIONS = ["What is the capital of France?", "Show me some code.", "Is that all?"]


def smollm_template(vocab: NativeModel) -> ChatTemplate:
    source = vocab.chat_template()
    assert source is not None
    assert "<|im_start|>" in source
    return ChatTemplate(source, vocab.token_text(vocab.bos_id), vocab.token_text(vocab.eos_id))


def family_template(name: str) -> ChatTemplate:
    bos, eos = OTHER_FAMILIES[name]
    return ChatTemplate((TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8").rstrip("\n"), bos, eos)


def all_templates(vocab: NativeModel) -> dict[str, ChatTemplate]:
    return {"smollm2": smollm_template(vocab), **{name: family_template(name) for name in OTHER_FAMILIES}}


def run_conversation(builder: PromptBuilder, vocab: NativeModel, opening: list[ChatMessage]) -> None:
    """Three turns; each prompt must start with the previous prompt plus its generated ids."""
    messages = list(opening)
    previous: list[int] | None = None
    previous_generated: list[int] = []
    for question, answer in zip(QUESTIONS, ANSWERS, strict=True):
        messages.append(ChatMessage.of(Role.USER, question))
        prompt = builder.build(messages)
        if previous is not None:
            expected = previous + previous_generated
            assert prompt[: len(expected)] == expected
            assert len(prompt) > len(expected)
        generated = vocab.tokenize(answer, add_special=False, parse_special=False)
        messages.append(ChatMessage(Role.ASSISTANT, (answer,), tuple(generated)))
        previous, previous_generated = prompt, generated


@pytest.mark.parametrize("family", ["smollm2", *OTHER_FAMILIES])
def test_prompts_only_grow(vocab: NativeModel, family: str) -> None:
    builder = PromptBuilder(all_templates(vocab)[family], vocab)
    run_conversation(builder, vocab, [])


@pytest.mark.parametrize("family", ["smollm2", *OTHER_FAMILIES])
def test_prompts_only_grow_with_a_persona(vocab: NativeModel, family: str) -> None:
    builder = PromptBuilder(all_templates(vocab)[family], vocab)
    run_conversation(builder, vocab, [ChatMessage.of(Role.SYSTEM, "You are a terse assistant.")])


@pytest.mark.parametrize("family", ["smollm2", "llama3", "gemma2", "mistral"])
def test_prompt_text_is_what_the_template_renders(vocab: NativeModel, family: str) -> None:
    """Building per message changes nothing the model sees: the text is the template's."""
    template = all_templates(vocab)[family]
    builder = PromptBuilder(template, vocab)
    messages: list[ChatMessage] = []
    for question, answer in zip(QUESTIONS, ANSWERS, strict=True):
        messages.append(ChatMessage.of(Role.USER, question))
        text = vocab.detokenize(builder.build(messages), special=True)
        rendered = template.render([item for m in messages for item in m.template_inputs()], add_generation_prompt=True)
        assert text == rendered
        # The stored answer is what the model generated: here, its tokens as a model would.
        generated = vocab.tokenize(answer.strip(), add_special=False, parse_special=False)
        messages.append(ChatMessage(Role.ASSISTANT, (answer.strip(),), tuple(generated)))


def test_document_tokens_do_not_depend_on_the_question(vocab: NativeModel) -> None:
    builder = PromptBuilder(smollm_template(vocab), vocab)
    persona = ChatMessage.of(Role.SYSTEM, "You analyse documents.")
    document = '<document name="notes.txt">\nThe meeting is at noon.\n</document>\n\n'
    first = builder.build([persona, ChatMessage.of(Role.USER, document, "When is the meeting?")])
    second = builder.build([persona, ChatMessage.of(Role.USER, document, "Where is it?")])
    shared = (
        builder.build([persona], add_generation_prompt=False)
        + builder.message_tokens([persona], ChatMessage.of(Role.USER, document, ""))[:-2]
    )  # all but the closing `<|im_end|>\n` of the probe
    assert first[: len(shared)] == shared == second[: len(shared)]
    assert first != second


def test_typed_special_tokens_stay_text(vocab: NativeModel) -> None:
    builder = PromptBuilder(smollm_template(vocab), vocab)
    prompt = builder.build([ChatMessage.of(Role.USER, "say <|im_end|> please")])
    im_end = vocab.tokenize("<|im_end|>", add_special=False, parse_special=True)
    assert len(im_end) == 1
    # Only the template's own markers are the special token: one after the default system, one after the user.
    assert prompt.count(im_end[0]) == 2


def test_persona_folds_into_first_question_without_a_system_role(vocab: NativeModel) -> None:
    builder = PromptBuilder(family_template("gemma2"), vocab)
    assert not builder.supports_system
    text = vocab.detokenize(
        builder.build([ChatMessage.of(Role.SYSTEM, "Be brief."), ChatMessage.of(Role.USER, "Hi")]), special=True
    )
    assert text == "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"


def test_answer_keeps_generated_ids_even_when_text_would_tokenize_differently(vocab: NativeModel) -> None:
    builder = PromptBuilder(smollm_template(vocab), vocab)
    question = [ChatMessage.of(Role.USER, "Spell it.")]
    # " hello" as two tokens, the way a sampler may produce it, not as the tokenizer would.
    odd_split = vocab.tokenize(" hel", add_special=False, parse_special=False) + vocab.tokenize(
        "lo", add_special=False, parse_special=False
    )
    assert odd_split != vocab.tokenize(" hello", add_special=False, parse_special=False)
    first = builder.build(question)
    second = builder.build(
        [*question, ChatMessage(Role.ASSISTANT, (" hello",), tuple(odd_split)), ChatMessage.of(Role.USER, "Again")]
    )
    assert second[: len(first) + len(odd_split)] == first + odd_split


# Drafts: the prompt of a message still being typed, for warming the KV ahead of Enter.

DOCUMENT = '<document name="notes.txt">\nThe meeting is at noon in room 4.\nBring the budget.\n</document>\n\n'
SENT_TEXTS = [
    "When is the meeting?",
    "Where is it?\n",  # a trailing newline: trimming templates cut it, and only it
    "  Who should bring the budget?",  # leading blanks
    "What's the room number, and is it on the 2nd floor?",
    "Résumé: ¿dónde está la sala? 会议在哪里？",
]
REALISTIC_SENTENCES = [
    "Could you summarise the main arguments of the second chapter in three bullet points?",
    "I tried running the script again, but it still fails with a permission error on /var/log.",
    "What's the difference between a list and a tuple in Python, and when should I use each one?",
    "My flight leaves at 07:45 tomorrow; how early should I be at the airport (international)?",
    "Please rewrite this paragraph so it sounds less formal, but keep the numbers: 12%, 3.5 km and $1,200.",
    "Is it true that octopuses have three hearts?  I read it somewhere... not sure.",
    "Explain it like I'm five:\nwhy is the sky blue during the day\nbut red at sunset?",
]


def openings(vocab: NativeModel) -> list[list[ChatMessage]]:
    """Conversations the draft may follow: nothing, a persona, and a persona with one exchange."""
    persona = ChatMessage.of(Role.SYSTEM, "You are a terse assistant.")
    answer = "The meeting is at noon."
    generated = tuple(vocab.tokenize(answer, add_special=False, parse_special=False))
    return [
        [],
        [persona],
        [persona, ChatMessage.of(Role.USER, DOCUMENT, "When?"), ChatMessage(Role.ASSISTANT, (answer,), generated)],
    ]


def settled_prefixes(text: str) -> list[str]:
    """What a typist has surely finished: the text up to each whitespace character."""
    return [text[: index + 1] for index, char in enumerate(text) if char.isspace()]


@pytest.mark.parametrize("family", ["smollm2", *OTHER_FAMILIES])
def test_an_empty_draft_is_a_prefix_of_the_prompt_sent(vocab: NativeModel, family: str) -> None:
    builder = PromptBuilder(all_templates(vocab)[family], vocab)
    for messages in openings(vocab):
        for parts_before in [(), (DOCUMENT,)]:
            draft = builder.draft_tokens(messages, ChatMessage.of(Role.USER, *parts_before, ""))
            assert draft[:1] == builder.build([*messages, ChatMessage.of(Role.USER, "x")])[:1]  # BOS and all
            for text in SENT_TEXTS:
                sent = builder.build([*messages, ChatMessage.of(Role.USER, *parts_before, text)])
                assert sent[: len(draft)] == draft, (messages, parts_before, text)
                assert len(sent) > len(draft)
            if parts_before:  # the document itself is warmed, not only what precedes it
                assert len(draft) > len(builder.draft_tokens(messages, ChatMessage.of(Role.USER, "")))


@pytest.mark.parametrize("family", ["smollm2", *OTHER_FAMILIES])
def test_a_settled_draft_but_its_last_token_is_a_prefix_of_the_prompt_sent(vocab: NativeModel, family: str) -> None:
    builder = PromptBuilder(all_templates(vocab)[family], vocab)
    for messages in openings(vocab):
        for parts_before in [(), (DOCUMENT,)]:
            for sentence in REALISTIC_SENTENCES:
                sent = builder.build([*messages, ChatMessage.of(Role.USER, *parts_before, sentence)])
                for settled in settled_prefixes(sentence):
                    draft = builder.draft_tokens(messages, ChatMessage.of(Role.USER, *parts_before, settled))[:-1]
                    assert sent[: len(draft)] == draft, (family, settled)


def test_a_draft_stops_at_the_end_of_its_content(vocab: NativeModel) -> None:
    """No closing `<|im_end|>` and no assistant header: those come only when the message is sent."""
    template = smollm_template(vocab)
    builder = PromptBuilder(template, vocab)
    for messages in openings(vocab):
        draft = ChatMessage.of(Role.USER, DOCUMENT, "When is the meeting? ")
        rendered = template.render(
            [item for m in [*messages, draft] for item in m.template_inputs()], add_generation_prompt=False
        )
        text = vocab.detokenize(builder.draft_tokens(messages, draft), special=True)
        assert text == rendered[: rendered.rindex(draft.content) + len(draft.content)]


def test_a_draft_folds_the_persona_without_a_system_role(vocab: NativeModel) -> None:
    builder = PromptBuilder(family_template("gemma2"), vocab)
    persona = ChatMessage.of(Role.SYSTEM, "Be brief.")
    draft = builder.draft_tokens([persona], ChatMessage.of(Role.USER, DOCUMENT, "When is "))
    assert vocab.detokenize(draft, special=True) == "<bos><start_of_turn>user\nBe brief.\n\n" + DOCUMENT + "When is "
    sent = builder.build([persona, ChatMessage.of(Role.USER, DOCUMENT, "When is the meeting?")])
    assert sent[: len(draft) - 1] == draft[:-1]


def test_trimming_templates_keep_the_document_tokens_whatever_follows(vocab: NativeModel) -> None:
    """`| trim` cuts the message's ends only: the document part keeps its own tokens."""
    builder = PromptBuilder(family_template("llama3"), vocab)
    document_only = builder.draft_tokens([], ChatMessage.of(Role.USER, DOCUMENT, ""))
    for text in ["Where?", "Where?\n\n", "Where? "]:
        assert builder.build([ChatMessage.of(Role.USER, DOCUMENT, text)])[: len(document_only)] == document_only
    text = vocab.detokenize(builder.build([ChatMessage.of(Role.USER, DOCUMENT, "Where? \n")]), special=True)
    assert text.endswith(DOCUMENT + "Where?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


def test_a_template_that_refuses_messages_gives_a_one_line_user_error() -> None:
    from chatapp.errors import ChatappError
    from chatapp.prompting.chat_template import ChatTemplate, TemplateRenderError

    template = ChatTemplate(
        source="{% for m in messages %}{% if m.role == 'user' and loop.index0 % 2 == 0 %}"
        "{{ raise_exception('Conversation roles must alternate') }}{% endif %}{% endfor %}",
        bos_token="",
        eos_token="",
    )
    with pytest.raises(ChatappError) as raised:
        template.render([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert isinstance(raised.value, TemplateRenderError)
    message = str(raised.value)
    assert "\n" not in message
    assert "Conversation roles must alternate" in message
    assert "start a new branch" in message


def test_remembered_histories_give_the_tokens_of_a_fresh_build(vocab) -> None:
    """The memo must never change a prompt: a second builder with nothing remembered agrees."""

    template = ChatTemplate(source=vocab.chat_template(), bos_token="", eos_token="")
    warm, fresh = PromptBuilder(template, vocab), PromptBuilder(template, vocab)
    document = "Lighthouse log. " * 200  # long enough to be remembered as text
    turns = [ChatMessage.of(Role.SYSTEM, "Be brief."), ChatMessage.of(Role.USER, document, "Who keeps it?")]
    first = warm.build(turns)
    turns += [
        ChatMessage(role=Role.ASSISTANT, parts=("A keeper.",), generated_ids=(1, 2, 3)),
        ChatMessage.of(Role.USER, "Since when?"),
    ]
    assert warm.build(turns) == fresh.build(turns)
    assert warm.build(turns[:2]) == first == fresh.build(turns[:2])
    edited = [*turns[:-1], ChatMessage.of(Role.USER, "Until when?")]
    assert warm.build(edited) == fresh.build(edited) != warm.build(turns)


QWEN3_THINKING_END = (
    "{% if add_generation_prompt and enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}"
)


def test_a_reasoning_switch_reaches_templates_that_read_it_and_no_other(vocab: NativeModel) -> None:
    plain = PromptBuilder(smollm_template(vocab), vocab)
    assert plain.with_reasoning(REASONING_OFF) is plain, "a template without a switch keeps its builder (and memo)"
    base = smollm_template(vocab)
    qwen_like = PromptBuilder(ChatTemplate(base.source + QWEN3_THINKING_END, base.bos_token, base.eos_token), vocab)
    messages = [ChatMessage.of(Role.USER, QUESTIONS[0])]
    default = qwen_like.build(messages)
    off = qwen_like.with_reasoning(REASONING_OFF).build(messages)
    assert vocab.detokenize(off).endswith("<think>\n\n</think>\n\n")
    assert off[: len(default)] == default
    assert qwen_like.with_reasoning(Reasoning(True, "high")).build(messages) == default
    assert qwen_like.with_reasoning(REASONING_OFF) is qwen_like.with_reasoning(REASONING_OFF)
    harmony = PromptBuilder(family_template("gpt_oss"), vocab)
    for reasoning, shown in (
        (None, "Reasoning: medium"),
        (REASONING_OFF, "Reasoning: low"),
        (Reasoning(True, "high"), "Reasoning: high"),
    ):
        assert shown in vocab.detokenize(harmony.with_reasoning(reasoning).build(messages))
