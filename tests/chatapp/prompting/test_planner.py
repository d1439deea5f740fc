"""The one prompt planner on the bundled model's vocabulary: a request's tokens, checkpoints and kept beginnings
from one build, drafts ending where the checkpoints sit, and where a prompt left another named in words."""

from __future__ import annotations

from chatapp.engine.llama_native import NativeModel
from chatapp.prompting.planner import PromptPlanner, settled_text
from chatapp.prompting.prompt import ChatMessage, PromptBuilder
from chatapp.vocabulary import Role

PERSONA = ChatMessage.of(Role.SYSTEM, "You are terse.\nYou answer in one line.\nToday is Monday.")
TURNS = [
    PERSONA,
    ChatMessage.of(Role.USER, "What is a verb?"),
    ChatMessage.of(Role.ASSISTANT, "A doing word."),
    ChatMessage.of(Role.USER, "DOCUMENT notes.txt: nouns name things.", "And a noun?"),
]


def planner(vocab: NativeModel) -> PromptPlanner:
    return PromptPlanner(PromptBuilder.for_model(vocab))


def test_a_plan_is_one_build_with_checkpoints_only_where_asked(vocab: NativeModel) -> None:
    plans = planner(vocab)
    plain = plans.plan(TURNS, checkpoints=False)
    assert plain.tokens == tuple(plans.builder.build(list(TURNS)))
    assert plain.checkpoints == ()
    assert plain.kept == ()
    assert plain.messages == tuple(TURNS)
    cut = plans.plan(TURNS, checkpoints=True)
    assert cut.tokens == plain.tokens
    assert cut.checkpoints == plans.boundaries(TURNS)
    assert len(cut.checkpoints) == 3  # after the persona, after the earlier turns, after the document
    assert all(0 < point < len(cut.tokens) for point in cut.checkpoints)


def test_each_boundary_is_where_the_draft_of_the_next_question_ends(vocab: NativeModel) -> None:
    plans = planner(vocab)
    tokens = plans.plan(TURNS, checkpoints=False).tokens
    after_turns = plans.draft_tokens(TURNS[:-1], (), "")
    after_document = plans.draft_tokens(TURNS[:-1], TURNS[-1].parts[:-1], "")
    assert {len(after_turns), len(after_document)} <= set(plans.boundaries(TURNS))
    assert tuple(after_document) == tokens[: len(after_document)]
    typed = plans.draft_tokens(TURNS[:-1], (), "Which noun is ")
    assert settled_text("Which noun is ") == "Which noun is "
    assert len(typed) > len(after_turns)


def test_kept_beginnings_are_their_lengths_and_checkpoints_where_the_state_cannot_be_cut(vocab: NativeModel) -> None:
    plans = planner(vocab)
    plain = plans.plan(TURNS, checkpoints=False, keep_through=[1, 0, 3])
    first = plans.kept_length(TURNS[:1], plain.tokens)
    assert plain.kept == (first, 0, plans.kept_length(TURNS[:3], plain.tokens))
    assert 0 < plain.kept[0] < plain.kept[2] < len(plain.tokens)
    assert plain.checkpoints == ()
    cut = plans.plan(TURNS, checkpoints=True, keep_through=[3])
    assert set(cut.checkpoints) == {*plans.boundaries(TURNS), cut.kept[0]}


def test_where_a_prompt_left_another_is_named_in_words(vocab: NativeModel) -> None:
    plans = planner(vocab)
    tokens = plans.plan(TURNS, checkpoints=False).tokens
    persona_end = plans.boundaries(TURNS)[0]
    changed = PERSONA.content.replace("Monday", "Tuesday")
    other = plans.plan([ChatMessage.of(Role.SYSTEM, changed), *TURNS[1:]], checkpoints=False).tokens
    differs = next(index for index, (a, b) in enumerate(zip(tokens, other, strict=False)) if a != b)
    assert differs < persona_end
    assert plans.place_of(TURNS, tokens, differs) == "line 3 of the system prompt"
    assert plans.place_of(TURNS, tokens, len(tokens) - 1) == "the answer's header"
    assert plans.place_of(TURNS, tokens, plans.boundaries(TURNS)[1] + 1) == "message 4 (user)"
