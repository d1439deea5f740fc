"""The one place that builds messages: ask, the TUI and the API give the same messages for one conversation."""

from __future__ import annotations

from chatapp.documents import Document
from chatapp.engine.engine import Engine
from chatapp.prompting.prompt import ChatMessage
from chatapp.records import MessageRecord
from chatapp.services.branches import prompt_messages
from chatapp.services.completions import ApiMessage, CompletionService
from chatapp.services.conversation import Conversation
from chatapp.services.messages import Turn, conversation_messages, document_block, next_question_parts
from chatapp.vocabulary import Role

PERSONA = "Answer briefly."
DOCUMENT = Document("notes.md", "The tide rises twice a day.")
ANSWER_IDS = (101, 102, 103)


def record(number: int, role: Role, text: str, ids: tuple[int, ...] | None = None) -> MessageRecord:
    return MessageRecord(number, 1, number - 1 or None, role, text, 0.0, generated_ids=ids)


def test_persona_first_and_the_document_in_the_first_question_only() -> None:
    turns = [Turn(Role.USER, "When?"), Turn(Role.ASSISTANT, "Twice.", ANSWER_IDS), Turn(Role.USER, "Why?")]
    messages = conversation_messages(PERSONA, DOCUMENT, turns)
    assert messages == [
        ChatMessage.of(Role.SYSTEM, PERSONA),
        ChatMessage.of(Role.USER, document_block(DOCUMENT), "When?"),
        ChatMessage(Role.ASSISTANT, ("Twice.",), ANSWER_IDS),
        ChatMessage.of(Role.USER, "Why?"),
    ]
    assert conversation_messages("", None, turns[:1]) == [ChatMessage.of(Role.USER, "When?")], "no persona: no system"


def test_an_answer_without_ids_is_tokenized_from_its_text(shared_engine: Engine) -> None:
    """An engine that could not vouch for its ids reports none: the answer must not vanish from the prompt."""
    builder = shared_engine.prompt_builder
    question = Turn(Role.USER, "When?")
    without_ids = conversation_messages(None, None, [question, Turn(Role.ASSISTANT, "Twice.", ())])
    as_text = conversation_messages(None, None, [question, Turn(Role.ASSISTANT, "Twice.")])
    assert builder.build(without_ids) == builder.build(as_text)
    assert len(builder.build(without_ids)) > len(builder.build(without_ids[:1])) + 2


def test_the_next_question_carries_the_document_until_one_was_asked() -> None:
    assert next_question_parts(DOCUMENT, []) == (document_block(DOCUMENT),)
    assert next_question_parts(DOCUMENT, [Turn(Role.USER, "When?")]) == ()
    assert next_question_parts(None, []) == ()


def test_ask_the_tui_and_the_api_build_the_same_messages(shared_engine: Engine) -> None:
    """One conversation (persona, question, answer with its ids, question) on each surface."""
    asked = Conversation(system_prompt=PERSONA)
    asked.add_user("When?")
    asked.add_answer("Twice.", ANSWER_IDS)
    asked.add_user("Why?")

    root = MessageRecord(0, 1, None, Role.SYSTEM, PERSONA, 0.0)
    path = [
        record(1, Role.USER, "When?"),
        record(2, Role.ASSISTANT, "Twice.", ANSWER_IDS),
        record(3, Role.USER, "Why?"),
    ]
    branch = prompt_messages(root, None, path)

    service = CompletionService(shared_engine, "model-a")
    api = service.chat_messages(
        (
            ApiMessage(Role.SYSTEM, PERSONA),
            ApiMessage(Role.USER, "When?"),
            ApiMessage(Role.ASSISTANT, "Twice."),
            ApiMessage(Role.USER, "Why?"),
        )
    )
    assert asked.prompt_messages() == branch
    # The API knows an answer's ids only when it gave the answer itself (none remembered here).
    assert [(m.role, m.parts) for m in api] == [(m.role, m.parts) for m in branch]
    builder = shared_engine.prompt_builder
    assert builder.build(asked.prompt_messages()) == builder.build(branch)
