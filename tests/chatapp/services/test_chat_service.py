"""ChatService on the real bundled model: conversations as trees of branches, append-only
prompts across a restart, edit / regenerate / switch, personas and documents as roots,
Q&A mode, warm-ahead and type-ahead."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from chatapp.documents import Document, load_document
from chatapp.engine.engine import Engine, EngineConfig
from chatapp.engine.kv_placement import FRESH_TOKENS
from chatapp.errors import ChatappError, DocumentError
from chatapp.prompting.prompt import ChatMessage
from chatapp.records import MessageRecord
from chatapp.services.answers import AnswerJob
from chatapp.services.branches import as_document, prompt_messages
from chatapp.services.chat_service import TITLE_CHARACTERS, ChatService, title_from
from chatapp.services.library import Library, open_library
from chatapp.services.messages import document_block, question_message
from chatapp.services.open_conversation import NEW_TITLE
from chatapp.services.prompt_plan import builder_of
from chatapp.services.startup import Workspace
from chatapp.vocabulary import MessageStatus, Role, StopReason
from tests.model_factory import HARMONY_TOKENS, write_tiny_llama
from tests.service_support import attach, cold_service, make_service, prefix_tokens

PERSONA_NAME = "Concise assistant"
DOCUMENT_TEXT = "\n".join(
    f"Item {n}: the committee reviewed budget line {n * 7} and agreed to revisit it in week {n + 2}."
    for n in range(1, 6)
)
QUESTION = "Which budget lines did the committee agree to revisit, and in which weeks?"


@pytest.fixture
def service(workspace: Workspace, library: Library, shared_engine: Engine) -> Iterator[ChatService]:
    chat = make_service(workspace, library, shared_engine)
    yield chat
    # Leave the shared engine idle for the next test.
    chat.stop_warming()
    assert chat.slot.prewarmer is not None
    chat.slot.prewarmer.wait()


@pytest.fixture
def document_file(tmp_path: Path) -> Path:
    path = tmp_path / "minutes.txt"
    path.write_text(DOCUMENT_TEXT + "\n", encoding="utf-8")
    return path


def unique_document(folder: Path, topic: str) -> Path:
    """A document no other test has asked about, so nothing of it is in the shared engine yet."""
    path = folder / f"{topic}.txt"
    lines = [
        f"Note {n}: the {topic} survey counted {n * 13} sites and revisits them in month {n + 1}." for n in range(1, 6)
    ]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def occurrences(haystack: Sequence[int], needle: Sequence[int]) -> int:
    haystack, needle = list(haystack), list(needle)
    return sum(1 for start in range(len(haystack) - len(needle) + 1) if haystack[start : start + len(needle)] == needle)


def sent_prompt(job: AnswerJob) -> list[int]:
    """The prompt tokens the job's request actually sent to the engine."""
    return list(job.handle.request.prompt_tokens)


def branch_prompt(service: ChatService, question_id: int) -> list[int]:
    """The prompt for a saved question, rebuilt from the database as a restarted app would."""
    path = service.conversations.path(question_id)
    document = as_document(service.conversations.get_document(path[0].document_id)) if path[0].document_id else None
    assert service.slot.engine is not None
    return builder_of(service.slot.engine).build(prompt_messages(path[0], document, path[1:]))


# Titles.
def test_title_is_the_first_line_of_the_first_question_shortened() -> None:
    assert title_from("  Hello there\nsecond line") == "Hello there"
    assert title_from("   ") == NEW_TITLE
    long = title_from("word " * 40)
    assert len(long) == TITLE_CHARACTERS
    assert long.endswith("…")


# Asking.
def test_ask_saves_the_answer_with_its_ids_and_figures_and_the_next_ask_continues(service: ChatService) -> None:
    view = service.current.new_conversation()
    assert view.conversation.title == NEW_TITLE
    assert view.messages == ()
    first = service.ask("What is 2+2?")
    assert first.question.role == Role.USER
    assert first.question.parent_id == view.root.id
    result = first.wait()
    # Whether this short answer ends by itself or at the answer length differs between CPUs: either way it is
    # saved with the status its end gives it.
    assert result.stop_reason in (StopReason.END, StopReason.LENGTH)
    assert first.answer is not None
    answer = service.conversations.get_message(first.answer.id)
    assert answer.role == Role.ASSISTANT
    assert answer.parent_id == first.question.id
    assert answer.content == result.text != ""
    assert answer.generated_ids == result.token_ids
    assert len(answer.generated_ids) > 0
    assert answer.status == MessageStatus.after(result.stop_reason)
    assert answer.stats is not None
    assert answer.stats["prompt_tokens"] == result.stats.prompt_tokens == len(sent_prompt(first))
    assert answer.stats["reused_tokens"] == result.stats.reused_tokens
    assert answer.stats["generated_tokens"] == len(result.token_ids)
    assert answer.stats["computed_tokens"] == result.stats.prompt_tokens - result.stats.reused_tokens

    view = service.current.view()
    assert view.conversation.title == "What is 2+2?"
    assert [m.record.id for m in view.messages] == [first.question.id, answer.id]
    assert [(c.id, c.title) for c in service.current.list_conversations()] == [(view.conversation.id, "What is 2+2?")]

    second = service.ask("And what is 3+3?")
    assert second.question.parent_id == answer.id
    second_result = second.wait()
    assert second_result.stats.reused_tokens >= result.stats.prompt_tokens
    assert second.answer is not None
    assert second.answer.stats is not None
    assert second.answer.stats["reused_tokens"] == second_result.stats.reused_tokens
    view = service.current.view()
    assert view.conversation.title == "What is 2+2?", "only the first question names the conversation"
    assert [m.record.role for m in view.messages] == [Role.USER, Role.ASSISTANT, Role.USER, Role.ASSISTANT]
    assert view.leaf.id == second.answer.id


def test_an_empty_question_or_no_engine_is_refused(workspace: Workspace, library: Library) -> None:
    loading = make_service(workspace, library, None)
    loading.current.new_conversation()
    with pytest.raises(ChatappError, match="still loading"):
        loading.ask("Hello?")
    assert loading.warm_ahead("") is None
    assert [m.record for m in loading.current.view().messages] == [], "a question that cannot be sent is not saved"
    with pytest.raises(ChatappError, match="empty"):
        loading.ask("   ")


# Append-only prompts, and the same prompts after a restart.
def test_prompts_rebuilt_after_a_restart_are_the_ones_sent_live(
    workspace: Workspace, library: Library, service: ChatService, shared_engine: Engine, document_file: Path
) -> None:
    service.current.new_conversation(library.personas.get_by_name(PERSONA_NAME))
    service.attach_document(document_file)
    first = service.ask(QUESTION)
    first_result = first.wait()
    second = service.ask("And which one comes first?")
    second_result = second.wait()
    third = service.ask("Thanks.")
    third.wait()
    live = [sent_prompt(job) for job in (first, second, third)]
    # Append-only: each turn's prompt begins with the previous prompt and its exact answer ids.
    assert live[1][: len(live[0]) + len(first_result.token_ids)] == live[0] + list(first_result.token_ids)
    assert live[2][: len(live[1]) + len(second_result.token_ids)] == live[1] + list(second_result.token_ids)
    assert branch_prompt(service, first.question.id) == live[0]
    conversation_id = service.current.conversation_id
    assert conversation_id is not None

    # A restart: a new library connection and a new service on the same database.
    reopened = open_library(workspace)
    try:
        restarted = make_service(workspace, reopened, shared_engine)
        view = restarted.current.open(conversation_id)
        assert third.answer is not None
        assert [m.record.id for m in view.messages][-1] == third.answer.id
        for job, prompt in zip((first, second, third), live, strict=True):
            assert branch_prompt(restarted, job.question.id) == prompt
        # The next question's prompt after the restart extends the last live prompt and answer.
        path = restarted.conversations.path(view.leaf.id)
        document = as_document(view.document)
        assert restarted.slot.engine is not None
        next_prompt = builder_of(restarted.slot.engine).build(
            [*prompt_messages(path[0], document, path[1:]), question_message("One more question.", None)]
        )
        assert next_prompt[: len(live[2]) + len(third.answer.generated_ids or ())] == live[2] + list(
            third.answer.generated_ids or ()
        )
        # Regenerating a saved question sends exactly the prompt it was first asked with.
        again = restarted.regenerate(second.question.id)
        assert sent_prompt(again) == live[1]
        again_result = again.wait()
        assert again_result.text == second_result.text
        assert again_result.stats.reused_tokens >= len(live[1]) - FRESH_TOKENS
        restarted.stop_warming()
    finally:
        reopened.close()


# Branches: edit, switch, jump.
def test_edit_makes_a_sibling_branch_that_switch_sibling_and_jump_to_move_between(service: ChatService) -> None:
    root = service.current.new_conversation().root
    q1 = service.ask("Name a fruit.")
    q1.wait()
    q2 = service.ask("Name a colour.")
    q2.wait()
    a1, a2 = q1.answer, q2.answer
    assert a1 is not None
    assert a2 is not None

    edited = service.edit(q2.question.id, "Name an animal.")
    assert edited.question.parent_id == q2.question.parent_id == a1.id
    assert edited.question.content == "Name an animal."
    edited.wait()
    assert edited.answer is not None
    view = service.current.view()
    assert [m.record.id for m in view.messages] == [q1.question.id, a1.id, edited.question.id, edited.answer.id]
    question = view.message(edited.question.id)
    assert question is not None
    assert (question.position, question.siblings) == (2, 2)
    first_question = view.message(q1.question.id)
    assert first_question is not None
    assert first_question.siblings == 1
    # The edited question's prompt is its branch's: the first turn, then the edited question.
    assert sent_prompt(edited) == branch_prompt(service, edited.question.id) != sent_prompt(q2)
    assert sent_prompt(edited)[: len(sent_prompt(q1)) + len(a1.generated_ids or ())] == sent_prompt(q1) + list(
        a1.generated_ids or ()
    )

    back = service.current.switch_sibling(edited.question.id, -1)
    assert [m.record.id for m in back.messages] == [q1.question.id, a1.id, q2.question.id, a2.id]
    original = back.message(q2.question.id)
    assert original is not None
    assert (original.position, original.siblings) == (1, 2)
    assert back.leaf.content == a2.content
    assert service.current.view().leaf.id == a2.id, "the switch is saved as the active leaf"
    # Stepping past either end stays on the last sibling.
    assert service.current.switch_sibling(q2.question.id, -1).leaf.id == a2.id
    assert service.current.switch_sibling(q2.question.id, +5).leaf.id == edited.answer.id

    # jump_to opens the most recent leaf under any message.
    assert service.current.jump_to(q2.question.id).leaf.id == a2.id
    assert service.current.jump_to(a2.id).leaf.id == a2.id
    assert service.current.jump_to(q1.question.id).leaf.id == edited.answer.id
    assert service.current.jump_to(a1.id).leaf.id == edited.answer.id
    assert service.current.jump_to(root.id).leaf.id == edited.answer.id
    assert len(service.current.tree()) == 1 + 6

    # Editing the first question branches from the root.
    first_edit = service.edit(q1.question.id, "Name a vegetable.")
    assert first_edit.question.parent_id == root.id
    first_edit.wait()
    view = service.current.view()
    assert [m.record.role for m in view.messages] == [Role.USER, Role.ASSISTANT]
    assert (view.messages[0].position, view.messages[0].siblings) == (2, 2)

    with pytest.raises(ChatappError, match="only your own messages"):
        service.edit(a1.id, "x")
    with pytest.raises(ChatappError, match="only your own messages"):
        service.edit(root.id, "x")


def test_regenerate_from_the_answer_or_the_question_adds_sibling_answers(service: ChatService) -> None:
    root = service.current.new_conversation().root
    asked = service.ask("Name a fruit.")
    original = asked.wait()
    first = asked.answer
    assert first is not None

    from_answer = service.regenerate(first.id)
    assert from_answer.question.id == asked.question.id
    assert sent_prompt(from_answer) == sent_prompt(asked)
    again = from_answer.wait()
    assert from_answer.answer is not None
    assert from_answer.answer.parent_id == asked.question.id
    assert from_answer.answer.id != first.id

    from_question = service.regenerate(asked.question.id)
    third = from_question.wait()
    assert from_question.answer is not None
    assert from_question.answer.parent_id == asked.question.id

    # Greedy sampling: the same prompt gives the same answer, token for token.
    assert again.text == third.text == original.text
    assert again.token_ids == third.token_ids == original.token_ids
    siblings = service.conversations.siblings(first.id)
    assert [s.id for s in siblings] == [first.id, from_answer.answer.id, from_question.answer.id]
    view = service.current.view()
    assert [m.record.id for m in view.messages] == [asked.question.id, from_question.answer.id]
    assert (view.messages[-1].position, view.messages[-1].siblings) == (3, 3)
    assert service.current.switch_sibling(from_question.answer.id, -2).leaf.id == first.id

    with pytest.raises(ChatappError, match="no question"):
        service.regenerate(root.id)


# Personas and documents start new roots.
def test_set_persona_starts_a_root_and_returning_reuses_the_existing_one(
    service: ChatService, library: Library
) -> None:
    plain = service.current.new_conversation()
    asked = service.ask("Name a fruit.")
    asked.wait()
    persona = library.personas.get_by_name(PERSONA_NAME)

    view = service.set_persona(persona)
    assert view.root.id != plain.root.id
    assert view.root.parent_id is None
    assert (view.root_position, view.root_count) == (2, 2)
    assert view.root.content == persona.prompt
    assert view.persona_name == persona.name
    assert view.messages == ()
    with_persona = service.ask("Name a colour.")
    with_persona.wait()
    assert service.slot.engine is not None
    persona_tokens = builder_of(service.slot.engine).build(
        [ChatMessage.of(Role.SYSTEM, persona.prompt)], add_generation_prompt=False
    )
    assert sent_prompt(with_persona)[: len(persona_tokens)] == persona_tokens
    assert with_persona.question.parent_id == view.root.id

    back = service.set_persona(None)
    assert back.root.id == plain.root.id
    assert (back.root_position, back.root_count) == (1, 2)
    assert asked.answer is not None
    assert back.leaf.id == asked.answer.id
    again = service.set_persona(persona)
    assert again.root.id == view.root.id
    assert again.root_count == 2
    assert with_persona.answer is not None
    assert again.leaf.id == with_persona.answer.id
    assert len(service.conversations.roots(plain.conversation.id)) == 2


def test_attach_document_puts_it_in_the_first_question_only(
    service: ChatService, library: Library, document_file: Path
) -> None:
    persona = library.personas.get_by_name(PERSONA_NAME)
    start = service.current.new_conversation(persona)
    assert start.document is None
    view, tokens = attach(service, document_file)
    assert view.document is not None
    assert view.document.name == "minutes.txt"
    assert view.document.text == DOCUMENT_TEXT
    assert view.root.document_id == view.document.id
    assert view.root.content == persona.prompt
    assert (view.root_position, view.root_count) == (1, 1), "the root left without a question is dropped"
    document = Document("minutes.txt", DOCUMENT_TEXT)
    assert tokens == prefix_tokens(service, view.root, document) == service.document_tokens(view.document)

    assert service.slot.engine is not None
    block = builder_of(service.slot.engine).tokenize(document_block(document))
    first = service.ask(QUESTION)
    first.wait()
    second = service.ask("And which one comes last?")
    second.wait()
    first_prompt, second_prompt = sent_prompt(first), sent_prompt(second)
    assert occurrences(first_prompt, block) == 1
    assert occurrences(second_prompt, block) == 1, "the second question does not repeat the document"
    assert second_prompt[: len(first_prompt)] == first_prompt
    # Every question about this persona and document begins with the same prefix.
    assert first_prompt[:tokens] == service.next_question_tokens(view.root, document, [], "")
    messages = prompt_messages(view.root, document, service.conversations.path(second.question.id)[1:])
    assert messages[1].parts == (document_block(document), QUESTION)
    assert messages[3].parts == ("And which one comes last?",)

    # Another persona keeps the document; attaching it again (same text) returns to its root.
    switched = service.set_persona(None)
    assert switched.root.content == ""
    assert switched.persona_name is None
    assert switched.root_count == 2
    assert switched.document is not None
    assert switched.document.id == view.document.id
    assert service.set_persona(persona).root.id == view.root.id
    assert service.attach_document(document_file)[0].root.id == view.root.id
    # Detaching returns to the persona's root without a document.
    detached = service.detach_document()
    assert detached.root.content == persona.prompt
    assert detached.document is None
    # Roots nobody asked under are dropped when left: the first (persona only) and the no-persona one.
    assert len(service.conversations.roots(start.conversation.id)) == 2


def test_qa_mode_asks_every_question_from_the_root(service: ChatService, document_file: Path) -> None:
    service.current.new_conversation()
    view, tokens = attach(service, document_file)
    service.current.set_qa_mode(True)
    assert service.current.view().conversation.qa_mode
    first = service.ask(QUESTION)
    first.wait()
    second = service.ask("Which item mentions week 5?")
    second.wait()
    assert first.question.parent_id == second.question.parent_id == view.root.id
    document = as_document(view.document)
    assert document is not None
    assert service.slot.engine is not None
    block = builder_of(service.slot.engine).tokenize(document_block(document))
    assert occurrences(sent_prompt(first), block) == occurrences(sent_prompt(second), block) == 1
    assert sent_prompt(first)[:tokens] == sent_prompt(second)[:tokens]
    # The second question left the first one's prompt after the document: the cache screen says where.
    divergence = service.figures.last_divergence
    assert divergence is not None
    assert tokens <= divergence.position < len(sent_prompt(second))
    assert sent_prompt(first)[: divergence.position] == sent_prompt(second)[: divergence.position]
    assert "week 5" in divergence.after
    view = service.current.view()
    assert second.answer is not None
    assert [m.record.id for m in view.messages] == [second.question.id, second.answer.id]
    assert (view.messages[0].position, view.messages[0].siblings) == (2, 2)
    service.current.set_qa_mode(False)
    third = service.ask("Thanks.")
    assert third.question.parent_id == second.answer.id
    third.wait()


def long_text(service: ChatService, root: MessageRecord, target_tokens: int) -> str:
    """A document text whose persona + document prefix is just below `target_tokens`."""
    sentence = "The river report lists one more finding for the audit. "
    low, high = 1, 400
    while low < high:
        middle = (low + high + 1) // 2
        if prefix_tokens(service, root, Document("report.txt", (sentence * middle).strip())) < target_tokens:
            low = middle
        else:
            high = middle - 1
    return (sentence * low).strip()


def test_a_document_that_does_not_fit_is_refused_with_both_numbers(service: ChatService, tmp_path: Path) -> None:
    view = service.current.new_conversation()
    path = tmp_path / "report.txt"
    path.write_text("The river report lists one more finding for the audit. " * 200, encoding="utf-8")
    tokens = prefix_tokens(service, view.root, load_document(path))
    assert service.slot.engine is not None
    limit = service.slot.engine.info.n_ctx_per_sequence
    assert tokens > limit == 1024
    with pytest.raises(DocumentError) as raised:
        service.attach_document(path)
    assert f"{tokens:,} tokens" in str(raised.value)
    assert f"{limit:,}" in str(raised.value)
    after = service.current.view()
    assert after.document is None, "a refused document starts no branch"
    assert after.root_count == 1, "a refused document starts no branch"

    # A document that fits, but leaves no room for the question: refused when asked, not saved.
    path.write_text(long_text(service, view.root, limit - 2), encoding="utf-8")
    attached, fitted = attach(service, path)
    assert limit - 8 <= fitted < limit
    with pytest.raises(DocumentError) as raised:
        service.ask("What does the report say about the audit findings, in detail?")
    assert f"{limit:,}" in str(raised.value)
    assert "Q&A mode" in str(raised.value)
    assert service.current.view().messages == ()
    assert service.current.view().root.id == attached.root.id


def test_a_branch_too_long_for_the_context_is_refused_without_a_document(service: ChatService) -> None:
    service.current.new_conversation()
    assert service.slot.engine is not None
    limit = service.slot.engine.info.n_ctx_per_sequence
    with pytest.raises(ChatappError) as raised:
        service.ask("Please summarise this. " + "The river report lists one more finding for the audit. " * 120)
    assert not isinstance(raised.value, DocumentError)
    assert f"holds {limit:,}" in str(raised.value)
    assert "new conversation" in str(raised.value)
    assert service.current.view().messages == ()
    assert service.current.view().conversation.title == NEW_TITLE


def test_a_document_longer_than_a_small_context_is_refused(
    data_dir: Path, model_path: Path, document_file: Path, tmp_path: Path
) -> None:
    with cold_service(data_dir, model_path, context_cap=256) as (service, _):
        view = service.current.new_conversation()
        assert service.slot.engine is not None
        assert service.slot.engine.info.n_ctx_per_sequence == 256
        path = tmp_path / "notes.md"
        path.write_text("\n".join([DOCUMENT_TEXT] * 3), encoding="utf-8")
        tokens = prefix_tokens(service, view.root, load_document(path))
        assert tokens >= 256
        with pytest.raises(DocumentError) as raised:
            service.attach_document(path)
        assert "notes.md" in str(raised.value)
        assert f"{tokens:,} tokens" in str(raised.value)
        assert "holds 256" in str(raised.value)
        # The short one fits, and the view shows it.
        attached, fitted = attach(service, document_file)
        assert fitted < 256
        assert attached.document is not None
        assert attached.document.name == "minutes.txt"


# Warm-ahead and type-ahead.
def test_warm_ahead_computes_the_persona_and_document_before_the_question(
    service: ChatService, library: Library, tmp_path: Path
) -> None:
    service.current.new_conversation(library.personas.get_by_name(PERSONA_NAME))
    _, tokens = attach(service, unique_document(tmp_path, "wetland"))
    handle = service.warm_ahead("")
    assert handle is not None
    assert handle.wait().stop_reason == StopReason.PREFILLED
    assert len(handle.handle.request.prompt_tokens) == tokens
    assert handle.handle.request.store
    assert service.warm_ahead("") is None, "nothing new to warm"
    asked = service.ask(QUESTION)
    result = asked.wait()
    assert sent_prompt(asked)[:tokens] == list(handle.handle.request.prompt_tokens)
    assert result.stats.reuse_tier == "device"
    assert result.stats.reused_tokens >= tokens


def test_type_ahead_sends_the_same_prompt_and_gets_the_cold_answer(
    service: ChatService, library: Library, tmp_path: Path, data_dir: Path, model_path: Path
) -> None:
    document_file = unique_document(tmp_path, "orchard")
    typed_question = "How many sites did the orchard survey count in all, and which month comes last?"
    persona = library.personas.get_by_name(PERSONA_NAME)
    service.current.new_conversation(persona)
    service.attach_document(document_file)
    service.warm_ahead("")
    assert service.slot.prewarmer is not None
    service.slot.prewarmer.wait()
    engine = service.slot.engine
    assert engine is not None
    cache = engine.cache
    assert cache is not None
    engine.flush_cache()
    stored_before_typing = set(cache.index.entries)
    # The question typed one character at a time; the app warms ahead on every keystroke.
    drafts = 0
    for end in range(1, len(typed_question) + 1):
        drafts += service.warm_ahead(typed_question[:end]) is not None
    assert drafts >= typed_question.count(" ") - 2, "each settled word is warmed"
    service.slot.prewarmer.wait()
    engine.flush_cache()
    assert set(cache.index.entries) == stored_before_typing, "drafts stay out of the RAM and disk tiers"
    typed = service.ask(typed_question)
    typed_result = typed.wait()
    prompt = sent_prompt(typed)
    assert typed_result.stats.reused_tokens >= len(prompt) - 8

    # A fresh service on another database, asking at once on a cold engine without a cache.
    with cold_service(data_dir / "cold", model_path) as (fresh, cold_library):
        fresh.current.new_conversation(cold_library.personas.get_by_name(PERSONA_NAME))
        fresh.attach_document(document_file)
        at_once = fresh.ask(typed_question)
        at_once_result = at_once.wait()
        assert sent_prompt(at_once) == prompt
        assert at_once_result.stats.reused_tokens == 0
        assert typed_result.text == at_once_result.text
        assert typed_result.token_ids == at_once_result.token_ids


def test_document_tokens_follow_the_persona_of_the_open_branch(
    service: ChatService, library: Library, document_file: Path
) -> None:
    service.current.new_conversation(library.personas.get_by_name(PERSONA_NAME))
    with_persona, tokens = attach(service, document_file)
    assert with_persona.document is not None
    assert service.document_tokens(with_persona.document) == tokens
    without_persona = service.set_persona(None)  # keeps the document, drops the persona's prompt
    assert without_persona.document is not None
    assert without_persona.document.id == with_persona.document.id
    expected = prefix_tokens(service, without_persona.root, as_document(without_persona.document))
    assert expected < tokens
    assert service.document_tokens(without_persona.document) == expected


def test_a_document_read_for_one_conversation_is_not_attached_to_another(
    service: ChatService, library: Library, document_file: Path
) -> None:
    first = service.current.new_conversation()
    prepared = service.prepare_document(document_file)
    assert prepared.conversation_id == first.conversation.id
    second = service.current.new_conversation()
    with pytest.raises(ChatappError, match="was not attached"):
        service.attach_prepared(prepared)
    assert service.current.view().document is None
    assert service.current.view().conversation.id == second.conversation.id
    service.current.open(first.conversation.id)
    assert service.attach_prepared(prepared).document is not None


def test_picking_the_persona_in_use_stays_on_the_branch_on_screen(service: ChatService, library: Library) -> None:
    persona = library.personas.get_by_name(PERSONA_NAME)
    service.current.new_conversation(persona)
    first = service.ask("Name a fruit.")
    first.wait()
    older = service.current.view()
    service.edit(first.question.id, "Name a vegetable.").wait()
    service.current.jump_to(older.messages[0].record.id)
    on_screen = service.current.view()
    assert on_screen.messages[0].record.content == "Name a fruit."
    assert service.set_persona(persona).leaf.id == on_screen.leaf.id, "not moved to the newest branch"


def test_a_question_left_unanswered_is_replaced_not_followed(service: ChatService) -> None:
    view = service.current.new_conversation()
    unanswered = service.conversations.add_message(view.conversation.id, view.root.id, Role.USER, "Lost question?")
    assert service.current.view().leaf.id == unanswered.id
    job = service.ask("Name a colour.")
    job.wait()
    assert job.question.parent_id == view.root.id, "a sibling of the unanswered question"
    roles = [m.record.role for m in service.current.view().messages]
    assert roles == [Role.USER, Role.ASSISTANT]


def test_the_model_loaded_at_start_is_the_latest_conversation_s_own(
    workspace: Workspace, library: Library, tmp_path: Path
) -> None:
    """Not the settings' model, then the other one: the conversation that opens first gets its model at
    once; a remembered model that no longer loads leaves the settings' one answering."""
    tiny = write_tiny_llama(tmp_path / "tiny.gguf")
    earlier = make_service(workspace, library, None)
    earlier.current.new_conversation()
    assert earlier.current.conversation_id is not None
    library.conversations.set_model(earlier.current.conversation_id, str(tiny))
    starting = make_service(workspace, library, None)
    starting.load_model()
    try:
        assert starting.slot.model_path() == tiny.resolve()
        starting.current.open_latest_or_new()
        assert starting.remembered_model() is None, "nothing left to switch to"
    finally:
        starting.close()
    tiny.write_bytes(b"GGUF" + bytes(64))  # a broken file where the model was
    fallback = make_service(workspace, library, None)
    fallback.load_model()
    try:
        assert fallback.slot.model_path() == workspace.model_path
    finally:
        fallback.close()


def test_a_gpt_oss_answer_shows_its_reply_not_its_reasoning(
    workspace: Workspace, library: Library, tmp_path: Path
) -> None:
    """Saved raw (the history needs its channels), shown as its reply: in the branch view and as it streams."""
    template = (Path(__file__).parents[1] / "prompting" / "templates" / "gpt_oss.jinja").read_text(encoding="utf-8")
    model = write_tiny_llama(tmp_path / "tiny-gpt_oss.gguf", chat_template=template, special_tokens=HARMONY_TOKENS)
    engine = Engine(EngineConfig(model, context_cap=256, sequences=1, threads=1))
    service = make_service(workspace, library, engine)
    try:
        raw = (
            "<|channel|>analysis<|message|>The user greets me.<|end|><|start|>assistant"
            "<|channel|>final<|message|>Hello! How can I help?"
        )
        service.current.new_conversation()
        assert service.current.conversation_id is not None
        question = library.conversations.add_message(
            service.current.conversation_id, service.current.view().root.id, Role.USER, "Hi"
        )
        library.conversations.add_message(service.current.conversation_id, question.id, Role.ASSISTANT, raw)
        answer = service.current.view().messages[-1]
        assert answer.record.content == raw
        assert answer.shown == "Hello! How can I help?"
        display = service.slot.answer_display()
        assert "".join(display.feed(raw[start : start + 7]) for start in range(0, len(raw), 7)) == answer.shown
        plain = make_service(workspace, library, None)  # no model yet: nothing to read it by
        plain.current.open(service.current.conversation_id)
        assert plain.current.view().messages[-1].shown == raw
    finally:
        service.close()
