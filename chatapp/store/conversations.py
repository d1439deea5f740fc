"""Conversations as message trees.

Editing a question or regenerating an answer adds a sibling instead of overwriting, so no
answer is ever lost; the conversation remembers which leaf is on screen. Every branch
starts at a "system" root with the persona and document, because changing either means
a different prompt prefix and so a different cached KV.

"Creation order" is id order: ids only grow, while two clock readings can be equal.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Iterable
from typing import Any

from chatapp.errors import StoreError
from chatapp.records import (
    ConversationRecord,
    DocumentRecord,
    MessageRecord,
)
from chatapp.store.database import connection_lock, transaction
from chatapp.vocabulary import MessageStatus, Role

_MESSAGE_FIELDS = (
    "id",
    "conversation_id",
    "parent_id",
    "role",
    "content",
    "created_at",
    "generated_ids",
    "stats",
    "status",
    "persona_name",
    "document_id",
)
_MESSAGE_COLUMNS = ", ".join(_MESSAGE_FIELDS)
_CONVERSATION_COLUMNS = "id, title, created_at, updated_at, active_leaf_id, qa_mode, model"
_DOCUMENT_COLUMNS = "id, name, text, source_path, added_at"
_FOLD = "chatapp_fold"


def _fold(text: str | None) -> str:
    """Unicode-aware case folding (SQLite's LIKE and lower() only fold ASCII)."""
    return text.casefold() if text is not None else ""


class ConversationStore:
    """Conversations, their message trees and the documents they are about."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection
        with connection_lock(connection):
            connection.create_function(_FOLD, 1, _fold, deterministic=True)

    # --- conversations -------------------------------------------------------------

    def create_conversation(self, title: str) -> ConversationRecord:
        title = _check_title(title)
        now = time.time()
        with transaction(self._connection) as db:
            cursor = db.execute(
                "INSERT INTO conversations (title, created_at, updated_at) VALUES (?, ?, ?)",
                (title, now, now),
            )
            return self._conversation(db, _lastrowid(cursor))

    def get_conversation(self, conversation_id: int) -> ConversationRecord:
        with transaction(self._connection, write=False) as db:
            return self._conversation(db, conversation_id)

    def list_conversations(self, query: str = "") -> list[ConversationRecord]:
        """Newest activity first; a query matches the title or any user/assistant message."""
        needle = _fold(query.strip())
        order = " ORDER BY updated_at DESC, id DESC"
        with transaction(self._connection, write=False) as db:
            if not needle:
                rows = db.execute(f"SELECT {_CONVERSATION_COLUMNS} FROM conversations{order}")
            else:
                # Roots hold persona prompts, which every conversation with that persona shares:
                # matching them would make the search useless.
                rows = db.execute(
                    f"SELECT {_CONVERSATION_COLUMNS} FROM conversations AS c "
                    f"WHERE instr({_FOLD}(c.title), :needle) > 0 OR EXISTS ("
                    f"  SELECT 1 FROM messages AS m WHERE m.conversation_id = c.id "
                    f"  AND m.role != '{Role.SYSTEM.value}' AND instr({_FOLD}(m.content), :needle) > 0)"
                    f"{order}",
                    {"needle": needle},
                )
            return [_conversation_record(row) for row in rows]

    def rename(self, conversation_id: int, title: str) -> ConversationRecord:
        title = _check_title(title)
        with transaction(self._connection) as db:
            self._conversation(db, conversation_id)
            db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))
            return self._conversation(db, conversation_id)

    def set_model(self, conversation_id: int, model: str | None) -> ConversationRecord:
        """Remember the model the conversation is answered with (its file's path)."""
        with transaction(self._connection) as db:
            self._conversation(db, conversation_id)
            db.execute("UPDATE conversations SET model = ? WHERE id = ?", (model, conversation_id))
            return self._conversation(db, conversation_id)

    def set_qa_mode(self, conversation_id: int, on: bool) -> ConversationRecord:
        with transaction(self._connection) as db:
            self._conversation(db, conversation_id)
            db.execute("UPDATE conversations SET qa_mode = ? WHERE id = ?", (int(bool(on)), conversation_id))
            return self._conversation(db, conversation_id)

    def set_active_leaf(self, conversation_id: int, message_id: int) -> ConversationRecord:
        """Remember which branch is on screen (any message of the conversation may be chosen)."""
        with transaction(self._connection) as db:
            self._conversation(db, conversation_id)
            self._message_in(db, conversation_id, message_id)
            db.execute("UPDATE conversations SET active_leaf_id = ? WHERE id = ?", (message_id, conversation_id))
            return self._conversation(db, conversation_id)

    def delete(self, conversation_id: int) -> None:
        """Delete a conversation and all its messages; documents stay (they are shared)."""
        with transaction(self._connection) as db:
            self._conversation(db, conversation_id)
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # --- messages --------------------------------------------------------------------

    def add_root(
        self,
        conversation_id: int,
        *,
        persona_name: str | None,
        persona_prompt: str,
        document_id: int | None,
    ) -> MessageRecord:
        """Start a new branch (a sibling of the existing roots) and make it the active leaf."""
        now = time.time()
        with transaction(self._connection) as db:
            self._conversation(db, conversation_id)
            if document_id is not None:
                self._document(db, document_id)
            return self._insert_leaf(
                db,
                conversation_id,
                now,
                role=Role.SYSTEM.value,
                content=persona_prompt,
                persona_name=persona_name,
                document_id=document_id,
            )

    def add_message(
        self,
        conversation_id: int,
        parent_id: int,
        role: Role,
        content: str,
        *,
        generated_ids: Iterable[int] | None = None,
        stats: dict[str, Any] | None = None,
        status: MessageStatus = MessageStatus.COMPLETE,
    ) -> MessageRecord:
        """Add a user or assistant message under `parent_id` and make it the active leaf."""
        if role not in (Role.USER, Role.ASSISTANT):
            raise StoreError(
                f"a message's role must be 'user' or 'assistant', not {role!r}; use add_root for a persona"
            )
        _check_status(status)
        ids_json = _ids_to_json(generated_ids)
        stats_json = _stats_to_json(stats)
        now = time.time()
        with transaction(self._connection) as db:
            self._conversation(db, conversation_id)
            self._message_in(db, conversation_id, parent_id)
            return self._insert_leaf(
                db,
                conversation_id,
                now,
                parent_id=parent_id,
                role=role,
                content=content,
                generated_ids=ids_json,
                stats=stats_json,
                status=status,
            )

    def update_message(
        self,
        message_id: int,
        *,
        content: str | None = None,
        generated_ids: Iterable[int] | None = None,
        stats: dict[str, Any] | None = None,
        status: MessageStatus | None = None,
    ) -> MessageRecord:
        """Change the given fields (None leaves a field as it is); used to finish a partial answer."""
        changes: dict[str, Any] = {}
        if content is not None:
            changes["content"] = content
        if generated_ids is not None:
            changes["generated_ids"] = _ids_to_json(generated_ids)
        if stats is not None:
            changes["stats"] = _stats_to_json(stats)
        if status is not None:
            changes["status"] = _check_status(status)
        with transaction(self._connection) as db:
            message = self._message(db, message_id)
            if changes:
                if message.role is Role.SYSTEM:
                    raise StoreError(
                        f"message {message_id} is a persona root and cannot be edited; start a new branch instead"
                    )
                assignments = ", ".join(f"{column} = :{column}" for column in changes)
                db.execute(f"UPDATE messages SET {assignments} WHERE id = :id", {**changes, "id": message_id})
                self._touch(db, message.conversation_id, time.time())
            return self._message(db, message_id)

    def get_message(self, message_id: int) -> MessageRecord:
        with transaction(self._connection, write=False) as db:
            return self._message(db, message_id)

    def discard_unused_root(self, message_id: int) -> bool:
        """Delete a root nobody wrote under (a persona or document tried and left); False if kept.

        A root with messages, or the conversation's only root, is kept.
        """
        with transaction(self._connection) as db:
            message = self._message(db, message_id)
            if message.parent_id is not None:
                return False
            if db.execute("SELECT 1 FROM messages WHERE parent_id = ? LIMIT 1", (message_id,)).fetchone():
                return False
            if len(self._roots(db, message.conversation_id)) < 2:
                return False
            conversation = self._conversation(db, message.conversation_id)
            if conversation.active_leaf_id == message_id:
                return False
            db.execute("DELETE FROM messages WHERE id = ?", (message_id,))
            return True

    def children(self, message_id: int) -> list[MessageRecord]:
        with transaction(self._connection, write=False) as db:
            self._message(db, message_id)
            rows = db.execute(f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE parent_id = ? ORDER BY id", (message_id,))
            return [_message_record(row) for row in rows]

    def roots(self, conversation_id: int) -> list[MessageRecord]:
        with transaction(self._connection, write=False) as db:
            self._conversation(db, conversation_id)
            return self._roots(db, conversation_id)

    def siblings(self, message_id: int) -> list[MessageRecord]:
        """The messages sharing this one's parent (all roots for a root), itself included."""
        with transaction(self._connection, write=False) as db:
            message = self._message(db, message_id)
            if message.parent_id is None:
                return self._roots(db, message.conversation_id)
            rows = db.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE parent_id = ? ORDER BY id", (message.parent_id,)
            )
            return [_message_record(row) for row in rows]

    def path(self, leaf_id: int) -> list[MessageRecord]:
        """The messages from the root down to `leaf_id`: what the model sees for that branch."""
        with transaction(self._connection, write=False) as db:
            self._message(db, leaf_id)
            rows = db.execute(
                "WITH RECURSIVE up(id, parent_id, depth) AS ("
                "  SELECT id, parent_id, 0 FROM messages WHERE id = ?"
                "  UNION ALL SELECT m.id, m.parent_id, up.depth + 1 FROM messages AS m JOIN up ON m.id = up.parent_id"
                f") SELECT {', '.join('m.' + name for name in _MESSAGE_FIELDS)} "
                "FROM up JOIN messages AS m ON m.id = up.id ORDER BY up.depth DESC",
                (leaf_id,),
            )
            return [_message_record(row) for row in rows]

    def latest_leaf(self, message_id: int) -> MessageRecord:
        """Follow the most recently created child down to a leaf (the message itself if none)."""
        with transaction(self._connection, write=False) as db:
            current = self._message(db, message_id)
            while True:
                row = db.execute(
                    f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE parent_id = ? ORDER BY id DESC LIMIT 1",
                    (current.id,),
                ).fetchone()
                if row is None:
                    return current
                current = _message_record(row)

    def messages(self, conversation_id: int) -> list[MessageRecord]:
        """Every message of the conversation in creation order (for the tree view)."""
        with transaction(self._connection, write=False) as db:
            self._conversation(db, conversation_id)
            rows = db.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ? ORDER BY id",
                (conversation_id,),
            )
            return [_message_record(row) for row in rows]

    # --- documents -------------------------------------------------------------------

    def add_document(self, name: str, text: str, source_path: str) -> DocumentRecord:
        """Store a document; the same name and text already stored returns that record."""
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        with transaction(self._connection) as db:
            rows = db.execute(
                f"SELECT {_DOCUMENT_COLUMNS} FROM documents WHERE name = ? AND text_sha256 = ? ORDER BY id",
                (name, digest),
            )
            for row in rows:
                if row[2] == text:
                    return _document_record(row)
            cursor = db.execute(
                "INSERT INTO documents (name, text, text_sha256, source_path, added_at) VALUES (?, ?, ?, ?, ?)",
                (name, text, digest, source_path, time.time()),
            )
            return self._document(db, _lastrowid(cursor))

    def get_document(self, document_id: int) -> DocumentRecord:
        with transaction(self._connection, write=False) as db:
            return self._document(db, document_id)

    def latest_document_source(self) -> str | None:
        """The path the newest stored document was read from (None when there is none)."""
        with transaction(self._connection, write=False) as db:
            row = db.execute("SELECT source_path FROM documents ORDER BY added_at DESC, id DESC LIMIT 1").fetchone()
            return None if row is None else str(row[0])

    # --- helpers (called inside a transaction) ---------------------------------------

    def _conversation(self, db: sqlite3.Connection, conversation_id: int) -> ConversationRecord:
        row = db.execute(
            f"SELECT {_CONVERSATION_COLUMNS} FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        if row is None:
            raise StoreError(f"conversation {conversation_id} does not exist (deleted?); reload the conversation list")
        return _conversation_record(row)

    def _message_in(self, db: sqlite3.Connection, conversation_id: int, message_id: int) -> MessageRecord:
        """A message of `conversation_id`; StoreError when it belongs to another (a stale screen)."""
        message = self._message(db, message_id)
        if message.conversation_id != conversation_id:
            raise StoreError(
                f"message {message_id} belongs to conversation {message.conversation_id}, "
                f"not {conversation_id}; reload the conversation"
            )
        return message

    def _message(self, db: sqlite3.Connection, message_id: int) -> MessageRecord:
        row = db.execute(f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise StoreError(
                f"message {message_id} does not exist (its conversation deleted?); reload the conversation"
            )
        return _message_record(row)

    def _document(self, db: sqlite3.Connection, document_id: int) -> DocumentRecord:
        row = db.execute(f"SELECT {_DOCUMENT_COLUMNS} FROM documents WHERE id = ?", (document_id,)).fetchone()
        if row is None:
            raise StoreError(f"document {document_id} is not in the database; attach the document again")
        return _document_record(row)

    def _roots(self, db: sqlite3.Connection, conversation_id: int) -> list[MessageRecord]:
        rows = db.execute(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ? AND parent_id IS NULL ORDER BY id",
            (conversation_id,),
        )
        return [_message_record(row) for row in rows]

    def _insert_leaf(self, db: sqlite3.Connection, conversation_id: int, now: float, **columns: Any) -> MessageRecord:
        """Insert a message of `conversation_id` with `columns` (names written here, never a caller's
        text) and make it the conversation's active leaf."""
        names = ["conversation_id", "created_at", *columns]
        cursor = db.execute(
            f"INSERT INTO messages ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
            (conversation_id, now, *columns.values()),
        )
        message_id = _lastrowid(cursor)
        self._touch(db, conversation_id, now, active_leaf_id=message_id)
        return self._message(db, message_id)

    def _touch(
        self, db: sqlite3.Connection, conversation_id: int, now: float, *, active_leaf_id: int | None = None
    ) -> None:
        if active_leaf_id is None:
            db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conversation_id))
        else:
            db.execute(
                "UPDATE conversations SET updated_at = ?, active_leaf_id = ? WHERE id = ?",
                (now, active_leaf_id, conversation_id),
            )


def _lastrowid(cursor: sqlite3.Cursor) -> int:
    assert cursor.lastrowid is not None
    return int(cursor.lastrowid)


def _check_title(title: str) -> str:
    title = " ".join(title.split())
    if not title:
        raise StoreError("a conversation title cannot be empty; type a title")
    return title


def _check_status(status: str) -> MessageStatus:
    try:
        return MessageStatus(status)
    except ValueError:
        known = ", ".join(MessageStatus)
        raise StoreError(f"unknown message status {status!r}; use one of {known}") from None


def _check_role(role: str) -> Role:
    try:
        return Role(role)
    except ValueError:
        raise StoreError(f"a message in the database has an unknown role {role!r}; the file is damaged") from None


def _ids_to_json(ids: Iterable[int] | None) -> str | None:
    """The ids as saved; none (NULL) when there are none: the answer's text is then tokenized."""
    if ids is None:
        return None
    try:
        listed = [int(token) for token in ids]
    except (TypeError, ValueError):
        raise StoreError("generated token ids must be integers; this is a bug in the caller") from None
    return json.dumps(listed, separators=(",", ":")) if listed else None


def _stats_to_json(stats: dict[str, Any] | None) -> str | None:
    if stats is None:
        return None
    try:
        return json.dumps(stats, separators=(",", ":"))
    except (TypeError, ValueError) as error:
        raise StoreError(f"answer statistics must be JSON-able ({error}); this is a bug in the caller") from None


def _message_record(row: tuple[Any, ...]) -> MessageRecord:
    (
        message_id,
        conversation_id,
        parent_id,
        role,
        content,
        created_at,
        ids_json,
        stats_json,
        status,
        persona_name,
        document_id,
    ) = row
    return MessageRecord(
        id=message_id,
        conversation_id=conversation_id,
        parent_id=parent_id,
        role=_check_role(role),
        content=content,
        created_at=created_at,
        generated_ids=tuple(json.loads(ids_json)) if ids_json is not None else None,
        stats=json.loads(stats_json) if stats_json is not None else None,
        status=_check_status(status),
        persona_name=persona_name,
        document_id=document_id,
    )


def _conversation_record(row: tuple[Any, ...]) -> ConversationRecord:
    conversation_id, title, created_at, updated_at, active_leaf_id, qa_mode, model = row
    return ConversationRecord(
        id=conversation_id,
        title=title,
        created_at=created_at,
        updated_at=updated_at,
        active_leaf_id=active_leaf_id,
        qa_mode=bool(qa_mode),
        model=model,
    )


def _document_record(row: tuple[Any, ...]) -> DocumentRecord:
    document_id, name, text, source_path, added_at = row
    return DocumentRecord(id=document_id, name=name, text=text, source_path=source_path, added_at=added_at)
