"""Conversations as message trees in a real SQLite file."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import cast

import pytest

from chatapp.errors import StoreError
from chatapp.records import MessageRecord
from chatapp.store.conversations import ConversationStore
from chatapp.store.database import open_database
from chatapp.vocabulary import MessageStatus, Role


@pytest.fixture
def store(connection: sqlite3.Connection) -> ConversationStore:
    return ConversationStore(connection)


def _start(store: ConversationStore, title: str = "Chat") -> tuple[int, MessageRecord]:
    conversation = store.create_conversation(title)
    root = store.add_root(conversation.id, persona_name="Helper", persona_prompt="Be helpful.", document_id=None)
    return conversation.id, root


def _answered_twice(
    store: ConversationStore, question: str, first: str, second: str
) -> tuple[int, MessageRecord, MessageRecord, MessageRecord, MessageRecord]:
    """A conversation whose question has two answers (a regenerate): its id, root, question and answers."""
    conversation_id, root = _start(store)
    asked = store.add_message(conversation_id, root.id, Role.USER, question)
    first_answer = store.add_message(conversation_id, asked.id, Role.ASSISTANT, first)
    second_answer = store.add_message(conversation_id, asked.id, Role.ASSISTANT, second)
    return conversation_id, root, asked, first_answer, second_answer


def _ids(messages: list[MessageRecord]) -> list[int]:
    return [message.id for message in messages]


def test_a_conversation_starts_with_a_persona_root_that_is_the_active_leaf(store: ConversationStore) -> None:
    conversation_id, root = _start(store)
    assert root.role == "system"
    assert root.parent_id is None
    assert (root.persona_name, root.content, root.document_id) == ("Helper", "Be helpful.", None)
    assert store.get_conversation(conversation_id).active_leaf_id == root.id


def test_editing_and_regenerating_make_siblings_and_keep_every_answer(store: ConversationStore) -> None:
    conversation_id, root, question, first, regenerated = _answered_twice(store, "What is 2+2?", "5", "4")
    edited = store.add_message(conversation_id, root.id, Role.USER, "What is 3+3?")
    edited_answer = store.add_message(conversation_id, edited.id, Role.ASSISTANT, "6")

    assert _ids(store.siblings(first.id)) == [first.id, regenerated.id]
    assert _ids(store.siblings(regenerated.id)) == [first.id, regenerated.id]
    assert _ids(store.siblings(edited.id)) == [question.id, edited.id]
    assert _ids(store.children(question.id)) == [first.id, regenerated.id]
    assert _ids(store.children(root.id)) == [question.id, edited.id]
    assert _ids(store.path(first.id)) == [root.id, question.id, first.id]
    assert [m.content for m in store.path(edited_answer.id)] == ["Be helpful.", "What is 3+3?", "6"]
    assert store.get_conversation(conversation_id).active_leaf_id == edited_answer.id
    assert len(store.messages(conversation_id)) == 6


def test_latest_leaf_follows_the_newest_child_down(store: ConversationStore) -> None:
    conversation_id, root, question, old_answer, new_answer = _answered_twice(store, "q", "old", "new")
    follow_up = store.add_message(conversation_id, old_answer.id, Role.USER, "more on the old one")
    assert store.latest_leaf(question.id).id == new_answer.id
    assert store.latest_leaf(root.id).id == new_answer.id
    assert store.latest_leaf(old_answer.id).id == follow_up.id
    assert store.latest_leaf(new_answer.id).id == new_answer.id


def test_a_new_persona_starts_a_sibling_root(store: ConversationStore) -> None:
    conversation_id, first_root = _start(store)
    document = store.add_document("notes.txt", "Some notes.", "/home/me/notes.txt")
    second_root = store.add_root(conversation_id, persona_name=None, persona_prompt="", document_id=document.id)
    assert _ids(store.roots(conversation_id)) == [first_root.id, second_root.id]
    assert _ids(store.siblings(second_root.id)) == [first_root.id, second_root.id]
    assert store.get_message(second_root.id).document_id == document.id
    assert store.get_conversation(conversation_id).active_leaf_id == second_root.id
    assert store.path(second_root.id) == [second_root]


def test_active_leaf_and_qa_mode_survive_reopening_the_file(db_path: Path) -> None:
    connection = open_database(db_path)
    store = ConversationStore(connection)
    conversation_id, root = _start(store)
    question = store.add_message(conversation_id, root.id, Role.USER, "q")
    first = store.add_message(conversation_id, question.id, Role.ASSISTANT, "a1")
    store.add_message(conversation_id, question.id, Role.ASSISTANT, "a2")
    store.set_active_leaf(conversation_id, first.id)
    store.set_qa_mode(conversation_id, True)
    connection.close()

    reopened = open_database(db_path)
    try:
        conversation = ConversationStore(reopened).get_conversation(conversation_id)
        assert conversation.active_leaf_id == first.id
        assert conversation.qa_mode is True
    finally:
        reopened.close()


def test_a_partial_answer_is_finished_with_its_token_ids_and_stats(store: ConversationStore) -> None:
    conversation_id, root = _start(store)
    question = store.add_message(conversation_id, root.id, Role.USER, "q")
    partial = store.add_message(conversation_id, question.id, Role.ASSISTANT, "Hel", status=MessageStatus.PARTIAL)
    assert partial.status == "partial"
    assert partial.generated_ids is None
    assert partial.stats is None

    finished = store.update_message(
        partial.id,
        content="Hello!",
        generated_ids=[15043, 29991],
        stats={"tokens": 2, "rate": float("inf"), "cached": {"tier": "ram"}},
        status=MessageStatus.STOPPED,
    )
    assert finished == store.get_message(partial.id)
    assert finished.content == "Hello!"
    assert finished.generated_ids == (15043, 29991)
    assert finished.stats == {"tokens": 2, "rate": float("inf"), "cached": {"tier": "ram"}}
    assert finished.status == "stopped"
    assert store.update_message(partial.id, content="Hello again").generated_ids == (15043, 29991)


def test_stored_token_ids_and_stats_are_json_text_not_pickles(
    store: ConversationStore, connection: sqlite3.Connection
) -> None:
    conversation_id, root = _start(store)
    answer = store.add_message(conversation_id, root.id, Role.ASSISTANT, "a", generated_ids=[1, 2, 3], stats={"n": 3})
    row = connection.execute("SELECT generated_ids, stats FROM messages WHERE id = ?", (answer.id,)).fetchone()
    assert row == ("[1,2,3]", '{"n":3}')


@pytest.mark.parametrize("status", list(MessageStatus))
def test_every_status_is_stored(store: ConversationStore, status: MessageStatus) -> None:
    conversation_id, root = _start(store)
    assert store.add_message(conversation_id, root.id, Role.ASSISTANT, "a", status=status).status == status


def test_wrong_messages_are_refused_with_one_line(store: ConversationStore) -> None:
    conversation_id, root = _start(store)
    other_id, other_root = _start(store, "Other")
    with pytest.raises(StoreError, match=f"belongs to conversation {other_id}"):
        store.add_message(conversation_id, other_root.id, Role.USER, "q")
    with pytest.raises(StoreError, match="role must be 'user' or 'assistant'"):
        store.add_message(conversation_id, root.id, Role.SYSTEM, "q")
    with pytest.raises(StoreError, match="unknown message status"):
        store.add_message(conversation_id, root.id, Role.ASSISTANT, "a", status=cast(MessageStatus, "done"))
    with pytest.raises(StoreError, match="message 999 does not exist"):
        store.get_message(999)
    with pytest.raises(StoreError, match="conversation 999 does not exist"):
        store.add_message(999, root.id, Role.USER, "q")
    with pytest.raises(StoreError, match="belongs to conversation"):
        store.set_active_leaf(conversation_id, other_root.id)
    with pytest.raises(StoreError, match="persona root"):
        store.update_message(root.id, content="new prompt")
    with pytest.raises(StoreError, match="document 42 is not in the database"):
        store.add_root(conversation_id, persona_name=None, persona_prompt="", document_id=42)
    assert len(store.messages(conversation_id)) == 1


def test_the_list_is_newest_activity_first(store: ConversationStore) -> None:
    first_id, first_root = _start(store, "First")
    second_id, _ = _start(store, "Second")
    assert [c.id for c in store.list_conversations()] == [second_id, first_id]
    store.add_message(first_id, first_root.id, Role.USER, "bump")
    assert [c.id for c in store.list_conversations()] == [first_id, second_id]


def test_search_matches_titles_and_messages_ignoring_case(store: ConversationStore) -> None:
    title_id, _ = _start(store, "Trip to Zürich")
    message_id, root = _start(store, "Untitled")
    store.add_message(message_id, root.id, Role.USER, "How do I parse a CSV file in Python?")
    _start(store, "Something else")

    assert [c.id for c in store.list_conversations("ZÜRICH")] == [title_id]
    assert [c.id for c in store.list_conversations("csv FILE")] == [message_id]
    assert store.list_conversations("nothing like this") == []
    assert len(store.list_conversations("  ")) == 3


def test_search_treats_wildcards_literally_and_skips_persona_prompts(store: ConversationStore) -> None:
    percent_id, root = _start(store, "Rates")
    store.add_message(percent_id, root.id, Role.ASSISTANT, "It grew 5% this year, see file_1.")
    _start(store, "Growth 5 percent")
    assert [c.id for c in store.list_conversations("5%")] == [percent_id]
    assert [c.id for c in store.list_conversations("file_1")] == [percent_id]
    assert store.list_conversations("%") == [store.get_conversation(percent_id)]
    # Every conversation's root says "Be helpful."; that is the persona, not the talk.
    assert store.list_conversations("helpful") == []


def test_rename_and_refuse_an_empty_title(store: ConversationStore) -> None:
    conversation_id, _ = _start(store, "Old")
    assert store.rename(conversation_id, "  New   title ").title == "New title"
    assert store.get_conversation(conversation_id).title == "New title"
    with pytest.raises(StoreError, match="title cannot be empty"):
        store.rename(conversation_id, "   ")
    with pytest.raises(StoreError, match="title cannot be empty"):
        store.create_conversation("")


def test_delete_removes_the_messages_but_keeps_shared_documents(
    store: ConversationStore, connection: sqlite3.Connection
) -> None:
    document = store.add_document("a.txt", "text", "/a.txt")
    kept_id, _ = _start(store, "Kept")
    conversation = store.create_conversation("Gone")
    root = store.add_root(conversation.id, persona_name=None, persona_prompt="", document_id=document.id)
    question = store.add_message(conversation.id, root.id, Role.USER, "q")
    store.add_message(conversation.id, question.id, Role.ASSISTANT, "a")

    store.delete(conversation.id)
    assert [c.id for c in store.list_conversations()] == [kept_id]
    left = connection.execute("SELECT count(*) FROM messages WHERE conversation_id = ?", (conversation.id,))
    assert left.fetchone()[0] == 0
    assert store.get_document(document.id) == document
    with pytest.raises(StoreError, match="does not exist"):
        store.get_message(question.id)
    with pytest.raises(StoreError, match="does not exist"):
        store.delete(conversation.id)


def test_the_same_document_is_stored_once(store: ConversationStore) -> None:
    first = store.add_document("report.txt", "Revenue grew.", "/one/report.txt")
    again = store.add_document("report.txt", "Revenue grew.", "/two/report.txt")
    changed = store.add_document("report.txt", "Revenue fell.", "/one/report.txt")
    renamed = store.add_document("copy.txt", "Revenue grew.", "/one/copy.txt")
    assert again == first
    assert len({first.id, changed.id, renamed.id}) == 3
    assert store.get_document(changed.id).text == "Revenue fell."
    with pytest.raises(StoreError, match="not in the database"):
        store.get_document(12345)


def test_the_latest_document_source_is_where_the_picker_opens(store: ConversationStore) -> None:
    assert store.latest_document_source() is None
    store.add_document("a.txt", "A", "/one/a.txt")
    store.add_document("b.txt", "B", "/two/b.txt")
    assert store.latest_document_source() == "/two/b.txt"


def test_threads_can_add_messages_at_the_same_time(store: ConversationStore) -> None:
    conversation_id, root = _start(store)
    errors: list[BaseException] = []

    def worker(number: int) -> None:
        try:
            parent = root.id
            for turn in range(20):
                parent = store.add_message(conversation_id, parent, Role.USER, f"thread {number} turn {turn}").id
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(number,)) for number in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(store.messages(conversation_id)) == 1 + 4 * 20
    assert len(store.children(root.id)) == 4
    for branch in store.children(root.id):
        assert len(store.path(store.latest_leaf(branch.id).id)) == 21


def test_only_an_unused_root_that_is_not_open_can_be_discarded(tmp_path: Path) -> None:
    connection = open_database(tmp_path / "chatapp.db")
    try:
        store = ConversationStore(connection)
        conversation = store.create_conversation("Roots")
        first = store.add_root(conversation.id, persona_name=None, persona_prompt="", document_id=None)
        assert not store.discard_unused_root(first.id), "the only root stays"
        second = store.add_root(conversation.id, persona_name="P", persona_prompt="p", document_id=None)
        assert not store.discard_unused_root(second.id), "the open root stays"
        question = store.add_message(conversation.id, second.id, Role.USER, "q")
        store.set_active_leaf(conversation.id, first.id)
        assert not store.discard_unused_root(second.id), "a root with messages stays"
        assert not store.discard_unused_root(question.id), "only roots are discarded"
        store.set_active_leaf(conversation.id, question.id)
        assert store.discard_unused_root(first.id)
        assert [root.id for root in store.roots(conversation.id)] == [second.id]
    finally:
        connection.close()
