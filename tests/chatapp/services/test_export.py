"""Exporting a branch as Markdown or JSON, written atomically."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chatapp.errors import ChatappError
from chatapp.records import ConversationRecord, DocumentRecord, MessageRecord
from chatapp.services.export import branch_to_json, branch_to_markdown, write_export
from chatapp.store.conversations import ConversationStore
from chatapp.store.database import open_database
from chatapp.vocabulary import MessageStatus, Role

DOCUMENT_TEXT = "SECRET-BODY " * 100
Branch = tuple[ConversationRecord, list[MessageRecord], DocumentRecord]


@pytest.fixture
def connection(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    connection = open_database(tmp_path / "chatapp.db")
    yield connection
    connection.close()


@pytest.fixture
def branch(connection: sqlite3.Connection) -> Branch:
    """A branch with a persona, a document, an answer that was regenerated and one stopped."""
    store = ConversationStore(connection)
    document = store.add_document("report.txt", DOCUMENT_TEXT, "/home/me/report.txt")
    conversation = store.create_conversation("Quarterly report")
    root = store.add_root(
        conversation.id,
        persona_name="Analyst",
        persona_prompt="Answer from the document.\nQuote it.",
        document_id=document.id,
    )
    question = store.add_message(conversation.id, root.id, Role.USER, "What grew?")
    store.add_message(conversation.id, question.id, Role.ASSISTANT, "DISCARDED ANSWER")
    answer = store.add_message(
        conversation.id,
        question.id,
        Role.ASSISTANT,
        "Revenue grew.",
        generated_ids=[1, 2, 3],
        stats={"tokens": 3, "rate": float("inf")},
    )
    follow_up = store.add_message(conversation.id, answer.id, Role.USER, "By how much?")
    stopped = store.add_message(conversation.id, follow_up.id, Role.ASSISTANT, "By", status=MessageStatus.STOPPED)
    return store.get_conversation(conversation.id), store.path(stopped.id), document


def test_markdown_has_title_persona_document_size_and_the_exchange(branch: Branch) -> None:
    conversation, path, document = branch
    text = branch_to_markdown(conversation, path, document)
    assert text.startswith("# Quarterly report\n")
    assert "**Persona:** Analyst" in text
    assert "> Answer from the document.\n> Quote it." in text
    assert f"**Document:** report.txt ({len(DOCUMENT_TEXT):,} characters)" in text
    assert "SECRET-BODY" not in text
    assert "DISCARDED ANSWER" not in text
    assert text.count("## You") == 2
    assert text.count("## Assistant") == 2
    assert text.index("What grew?") < text.index("Revenue grew.") < text.index("By how much?")
    assert text.rstrip().endswith("By\n\n*(answer stopped)*")


def test_markdown_notes_a_cut_off_answer_and_omits_an_empty_persona(connection: sqlite3.Connection) -> None:
    store = ConversationStore(connection)
    conversation = store.create_conversation("Plain")
    root = store.add_root(conversation.id, persona_name=None, persona_prompt="", document_id=None)
    question = store.add_message(conversation.id, root.id, Role.USER, "Tell me a long story")
    answer = store.add_message(conversation.id, question.id, Role.ASSISTANT, "Once upon", status=MessageStatus.CUT_OFF)
    text = branch_to_markdown(conversation, store.path(answer.id), None)
    assert "*(answer cut off)*" in text
    assert "Persona" not in text
    assert "Document" not in text


def test_json_has_the_documented_shape(branch: Branch) -> None:
    conversation, path, document = branch
    before = time.time()
    data = branch_to_json(conversation, path, document)
    assert data["format"] == "chatapp.branch"
    assert data["version"] == 1
    assert data["title"] == "Quarterly report"
    assert before <= data["exported_at"] <= time.time()
    assert data["persona"] == {"name": "Analyst", "prompt": "Answer from the document.\nQuote it."}
    assert data["document"] == {
        "name": "report.txt",
        "source_path": "/home/me/report.txt",
        "characters": len(DOCUMENT_TEXT),
    }
    assert [(m["role"], m["content"], m["status"]) for m in data["messages"]] == [
        ("user", "What grew?", "complete"),
        ("assistant", "Revenue grew.", "complete"),
        ("user", "By how much?", "complete"),
        ("assistant", "By", "stopped"),
    ]
    assert data["messages"][1]["stats"] == {"tokens": 3, "rate": None}
    assert "stats" not in data["messages"][0]
    assert data["messages"][0]["created_at"] == path[1].created_at
    assert all("generated_ids" not in m for m in data["messages"])


def test_write_export_writes_json_and_text_and_replaces_atomically(branch: Branch, tmp_path: Path) -> None:
    conversation, path, document = branch
    data = branch_to_json(conversation, path, document)
    data["title"] = "Café ☕"
    json_path = write_export(data, tmp_path / "out.json")
    written = json_path.read_text(encoding="utf-8")
    assert "Café ☕" in written
    assert '\n  "format": "chatapp.branch"' in written
    assert json.loads(written) == data

    markdown_path = tmp_path / "out.md"
    markdown_path.write_text("old content", encoding="utf-8")
    assert write_export("# New\n", markdown_path) == markdown_path
    assert markdown_path.read_text(encoding="utf-8") == "# New\n"
    # Nothing but the two exports (and the database) is left: no temporary files.
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("chatapp.db")) == ["out.json", "out.md"]


def test_write_export_errors_are_one_line_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ChatappError, match="does not exist; create it or choose another"):
        write_export("x", tmp_path / "missing" / "out.md")
    with pytest.raises(ChatappError, match="it is a folder; give a file name"):
        write_export({"a": 1}, tmp_path)
    assert list(tmp_path.iterdir()) == []
