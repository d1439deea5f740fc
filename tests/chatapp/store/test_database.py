"""Opening the database file: creation, migrations, newer files and damaged files."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import pytest

from chatapp.errors import StoreError
from chatapp.store import database
from chatapp.store.conversations import ConversationStore
from chatapp.store.database import SCHEMA_VERSION, open_database

TABLES = {"conversations", "messages", "documents", "personas", "seeded_personas"}


def _tables(connection: sqlite3.Connection) -> set[str]:
    rows = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    return {row[0] for row in rows}


def _user_version(path: Path) -> int:
    with sqlite3.connect(path) as plain:
        return int(plain.execute("PRAGMA user_version").fetchone()[0])


def test_a_new_database_is_private_wal_with_foreign_keys_and_the_current_schema(tmp_path: Path) -> None:
    path = tmp_path / "chatapp.db"
    connection = open_database(path)
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert connection.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert connection.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
        assert connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert _tables(connection) >= TABLES
    finally:
        connection.close()


def test_an_empty_file_is_version_0_and_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "chatapp.db"
    path.touch()
    connection = open_database(path)
    connection.close()
    assert _user_version(path) == SCHEMA_VERSION
    with sqlite3.connect(path) as plain:
        assert _tables(plain) >= TABLES


def test_reopening_keeps_the_data_and_does_not_migrate_again(tmp_path: Path) -> None:
    path = tmp_path / "chatapp.db"
    first = open_database(path)
    ConversationStore(first).create_conversation("Kept")
    first.close()
    second = open_database(path)
    try:
        assert [c.title for c in ConversationStore(second).list_conversations()] == ["Kept"]
    finally:
        second.close()


def test_migrations_run_in_order_from_the_files_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "chatapp.db"
    open_database(path).close()

    def add_column(connection: sqlite3.Connection) -> None:
        connection.execute("ALTER TABLE conversations ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0")

    monkeypatch.setattr(database, "SCHEMA_VERSION", SCHEMA_VERSION + 2)
    monkeypatch.setattr(
        database,
        "MIGRATIONS",
        [*database.MIGRATIONS, add_column, ["UPDATE conversations SET pinned = 7"]],
    )
    with sqlite3.connect(path) as plain:
        plain.execute("INSERT INTO conversations (title, created_at, updated_at) VALUES ('old', 0, 0)")
    connection = open_database(path)
    try:
        assert connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 2
        # The second new migration saw the first one's column: they ran in order.
        assert connection.execute("SELECT title, pinned FROM conversations").fetchall() == [("old", 7)]
    finally:
        connection.close()


def test_a_failing_migration_leaves_the_file_at_its_old_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "chatapp.db"
    open_database(path).close()
    monkeypatch.setattr(database, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    monkeypatch.setattr(
        database,
        "MIGRATIONS",
        [*database.MIGRATIONS, ["CREATE TABLE extra (x)", "INSERT INTO no_such_table VALUES (1)"]],
    )
    with pytest.raises(StoreError, match="database failed"):
        open_database(path)
    assert _user_version(path) == SCHEMA_VERSION
    with sqlite3.connect(path) as plain:
        assert "extra" not in _tables(plain)


def test_a_file_from_a_newer_chatapp_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "chatapp.db"
    open_database(path).close()
    with sqlite3.connect(path) as plain:
        plain.execute("PRAGMA user_version = 99")
    with pytest.raises(StoreError) as raised:
        open_database(path)
    message = str(raised.value)
    assert str(path) in message
    assert f"newer chatapp (schema 99, this one knows {SCHEMA_VERSION}); upgrade chatapp" in message
    assert "\n" not in message
    assert _user_version(path) == 99
    assert not list(tmp_path.glob("*.corrupt-*"))


def test_a_file_that_is_not_a_database_is_copied_aside_and_never_reset(tmp_path: Path) -> None:
    path = tmp_path / "chatapp.db"
    original = b"these are my notes, not a database\n" * 50
    path.write_bytes(original)
    with pytest.raises(StoreError) as raised:
        open_database(path)
    backups = list(tmp_path.glob("chatapp.db.corrupt-*"))
    assert len(backups) == 1
    assert backups[0].read_bytes() == original
    assert path.read_bytes() == original
    message = str(raised.value)
    assert f"{path} is damaged" in message
    assert str(backups[0]) in message
    assert "move it away to start a fresh database" in message
    assert stat.S_IMODE(backups[0].stat().st_mode) == 0o600


def test_a_database_with_damaged_pages_is_detected_and_copied_aside(tmp_path: Path) -> None:
    path = tmp_path / "chatapp.db"
    connection = open_database(path)
    store = ConversationStore(connection)
    for number in range(100):
        conversation = store.create_conversation(f"Conversation {number}")
        store.add_root(conversation.id, persona_name=None, persona_prompt="x" * 500, document_id=None)
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    connection.close()
    damaged = bytearray(path.read_bytes())
    damaged[4096 * 3 : 4096 * 6] = b"\x5a" * (4096 * 3)
    path.write_bytes(bytes(damaged))

    with pytest.raises(StoreError, match="is damaged"):
        open_database(path)
    (backup,) = tmp_path.glob("chatapp.db.corrupt-*")
    assert backup.read_bytes() == bytes(damaged)


def test_a_second_damaged_backup_in_the_same_second_does_not_overwrite_the_first(tmp_path: Path) -> None:
    path = tmp_path / "chatapp.db"
    path.write_bytes(b"first garbage" * 100)
    with pytest.raises(StoreError):
        open_database(path)
    path.write_bytes(b"second garbage" * 100)
    with pytest.raises(StoreError):
        open_database(path)
    contents = {backup.read_bytes() for backup in tmp_path.glob("chatapp.db.corrupt-*")}
    assert contents == {b"first garbage" * 100, b"second garbage" * 100}


def test_a_missing_folder_is_one_line_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"cannot create database .*choose another with --data-dir"):
        open_database(tmp_path / "missing" / "chatapp.db")


def test_a_folder_in_place_of_the_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "chatapp.db").mkdir()
    with pytest.raises(StoreError, match="is a folder"):
        open_database(tmp_path / "chatapp.db")


def test_a_version_1_file_gains_the_pins_table_and_keeps_its_conversations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "chatapp.db"
    with monkeypatch.context() as old_code:
        old_code.setattr(database, "SCHEMA_VERSION", 1)
        old_code.setattr(database, "MIGRATIONS", database.MIGRATIONS[:1])
        first = open_database(path)
        with first:  # as version 1 wrote a conversation (today's store reads columns added since)
            first.execute("INSERT INTO conversations (title, created_at, updated_at) VALUES ('From version 1', 0, 0)")
        first.close()
    assert _user_version(path) == 1
    connection = open_database(path)
    try:
        assert _user_version(path) == SCHEMA_VERSION >= 2
        assert "pins" in _tables(connection)
        assert [c.title for c in ConversationStore(connection).list_conversations()] == ["From version 1"]
    finally:
        connection.close()


def test_a_version_2_file_is_migrated_to_allow_failed_answers_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "chatapp.db"
    old_check = "CHECK (status IN ('complete', 'stopped', 'cut_off', 'partial'))"
    with sqlite3.connect(path) as plain:  # the file as schema 2 wrote it
        for statement in [*database._SCHEMA_1, *database._SCHEMA_2]:
            plain.execute(statement.replace("'partial', 'failed'", "'partial'"))
        plain.execute("PRAGMA user_version = 2")
    with sqlite3.connect(path) as plain:
        assert old_check in plain.execute("SELECT sql FROM sqlite_master WHERE name = 'messages'").fetchone()[0]
        plain.execute("INSERT INTO conversations (title, created_at, updated_at) VALUES ('Kept', 0, 0)")
        plain.execute(
            "INSERT INTO messages (conversation_id, parent_id, role, content, created_at) "
            "VALUES (1, NULL, 'system', '', 0)"
        )
        with pytest.raises(sqlite3.IntegrityError):
            plain.execute(
                "INSERT INTO messages (conversation_id, parent_id, role, content, created_at, status) "
                "VALUES (1, 1, 'assistant', 'half', 0, 'failed')"
            )
    connection = open_database(path)
    try:
        assert connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 3
        connection.execute(
            "INSERT INTO messages (conversation_id, parent_id, role, content, created_at, status) "
            "VALUES (1, 1, 'assistant', 'half', 0, 'failed')"
        )
        assert [c.title for c in ConversationStore(connection).list_conversations()] == ["Kept"]
        assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        connection.close()


def test_a_version_3_file_gains_each_conversation_s_model_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "chatapp.db"
    with sqlite3.connect(path) as plain:  # the file as schema 3 wrote it
        for statement in [*database._SCHEMA_1, *database._SCHEMA_2]:
            plain.execute(statement)
        plain.execute("PRAGMA user_version = 3")
        plain.execute("INSERT INTO conversations (title, created_at, updated_at) VALUES ('Kept', 0, 0)")
    connection = open_database(path)
    try:
        assert connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 4
        store = ConversationStore(connection)
        (kept,) = store.list_conversations()
        assert (kept.title, kept.model) == ("Kept", None)
        assert store.set_model(kept.id, "/models/gemma.gguf").model == "/models/gemma.gguf"
    finally:
        connection.close()
