"""Opening the SQLite file that holds conversations and personas.

One connection is shared by the UI thread and worker threads, so it is opened with
`check_same_thread=False` and every operation takes the connection's lock (see
`transaction`). Transactions are explicit (`isolation_level=None`) so that a migration or
an operation is all-or-nothing. A damaged file is never reset silently: it is copied aside
and the user is told where the copy is.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from chatapp.errors import StoreError

SCHEMA_VERSION = 5
FILE_MODE = 0o600
BUSY_TIMEOUT_MS = 5000

# Error names that mean the file itself is bad (rather than locked, missing or read-only).
_DAMAGED = {"SQLITE_CORRUPT", "SQLITE_NOTADB"}

Migration = Sequence[str] | Callable[[sqlite3.Connection], None]

_SCHEMA_1: tuple[str, ...] = (
    """CREATE TABLE documents (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL,
        text TEXT NOT NULL,
        text_sha256 TEXT NOT NULL,
        source_path TEXT NOT NULL,
        added_at REAL NOT NULL
    )""",
    "CREATE INDEX documents_by_content ON documents (name, text_sha256)",
    # active_leaf_id is checked by the store, not by a foreign key: a key would make
    # conversations and messages refer to each other and complicate deletion.
    """CREATE TABLE conversations (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        active_leaf_id INTEGER,
        qa_mode INTEGER NOT NULL DEFAULT 0
    )""",
    "CREATE INDEX conversations_by_update ON conversations (updated_at)",
    """CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
        parent_id INTEGER REFERENCES messages (id) ON DELETE CASCADE,
        role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
        content TEXT NOT NULL,
        created_at REAL NOT NULL,
        generated_ids TEXT,
        stats TEXT,
        status TEXT NOT NULL DEFAULT 'complete'
            CHECK (status IN ('complete', 'stopped', 'cut_off', 'partial', 'failed')),
        persona_name TEXT,
        document_id INTEGER REFERENCES documents (id),
        CHECK ((role = 'system') = (parent_id IS NULL))
    )""",
    "CREATE INDEX messages_by_conversation ON messages (conversation_id, id)",
    "CREATE INDEX messages_by_parent ON messages (parent_id, id)",
    # name_key is the case-folded name: names are unique regardless of case.
    """CREATE TABLE personas (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL,
        name_key TEXT NOT NULL UNIQUE,
        prompt TEXT NOT NULL,
        bundled INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    )""",
    # Bundled personas seeded once; a user's deletion must not be undone by the next start.
    """CREATE TABLE seeded_personas (
        name_key TEXT PRIMARY KEY,
        seeded_at REAL NOT NULL
    )""",
)

# Version 2: the prefixes the user pinned in the cache, with the tokens needed to unpin them.
_SCHEMA_2: tuple[str, ...] = (
    """CREATE TABLE pins (
        id INTEGER PRIMARY KEY,
        kind TEXT NOT NULL,
        label TEXT NOT NULL,
        tokens TEXT NOT NULL,
        created_at REAL NOT NULL
    )""",
)


def _allow_failed_status(connection: sqlite3.Connection) -> None:
    """Version 3: an answer the engine failed midway is 'failed' (it was saved as 'partial', as after a crash).

    Only the CHECK constraint changes, which leaves every stored row as it is: SQLite's documented
    way for such a change is to edit the table's SQL in the schema (ALTER TABLE, "making other
    kinds of table schema changes"), then check the file.
    """
    old = "CHECK (status IN ('complete', 'stopped', 'cut_off', 'partial'))"
    new = "CHECK (status IN ('complete', 'stopped', 'cut_off', 'partial', 'failed'))"
    schema_version = int(connection.execute("PRAGMA schema_version").fetchone()[0])
    connection.execute("PRAGMA writable_schema = ON")
    try:
        connection.execute(
            "UPDATE sqlite_master SET sql = replace(sql, ?, ?) WHERE type = 'table' AND name = 'messages'", (old, new)
        )
        connection.execute(f"PRAGMA schema_version = {schema_version + 1}")
    finally:
        connection.execute("PRAGMA writable_schema = OFF")
    table = connection.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'messages'").fetchone()
    if table is None or new not in table[0]:
        raise StoreError(
            "this SQLite refused the schema change that adds the 'failed' answer status (defensive mode?); "
            "run chatapp with Python's own sqlite3 module, or report it"
        )
    problem = connection.execute("PRAGMA quick_check").fetchone()[0]
    if problem != "ok":
        raise sqlite3.DatabaseError(f"the schema change left the file inconsistent: {problem}")


# Version 4: the model a conversation was last answered with (its file's path; NULL: the default).
_SCHEMA_4: tuple[str, ...] = ("ALTER TABLE conversations ADD COLUMN model TEXT",)

# Version 5: pins that end (a request's cache_control: NULL never ends), and the cache namespace (the
# model) whose blocks a pin holds ('' for pins made before: the model they were made with is unknown).
_SCHEMA_5: tuple[str, ...] = (
    "ALTER TABLE pins ADD COLUMN expires_at REAL",
    "ALTER TABLE pins ADD COLUMN namespace TEXT NOT NULL DEFAULT ''",
)

# MIGRATIONS[n] takes a file from version n to n + 1.
MIGRATIONS: list[Migration] = [_SCHEMA_1, _SCHEMA_2, _allow_failed_status, _SCHEMA_4, _SCHEMA_5]
assert len(MIGRATIONS) == SCHEMA_VERSION


class _LockedConnection(sqlite3.Connection):
    """A connection that carries the lock every store on it shares."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.chatapp_lock = threading.RLock()


# Connections not opened by `open_database` cannot carry a lock; they share this one.
_FALLBACK_LOCK = threading.RLock()


def connection_lock(connection: sqlite3.Connection) -> threading.RLock:
    """The lock that serialises all use of `connection` across threads and stores."""
    return getattr(connection, "chatapp_lock", _FALLBACK_LOCK)


def _roll_back(connection: sqlite3.Connection) -> None:
    if connection.in_transaction:
        connection.execute("ROLLBACK")


@contextmanager
def transaction(connection: sqlite3.Connection, *, write: bool = True) -> Iterator[sqlite3.Connection]:
    """Hold the connection's lock and run the block in one transaction.

    A block inside another block joins the outer transaction. SQLite failures (disk full,
    locked by another program) become one-line StoreErrors.
    """
    with connection_lock(connection):
        if connection.in_transaction:
            yield connection
            return
        try:
            connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield connection
            except BaseException:
                _roll_back(connection)
                raise
            connection.execute("COMMIT")
        except sqlite3.Error as error:
            _roll_back(connection)
            raise StoreError(
                f"the conversations database failed ({error}); "
                "check free disk space and that no other program holds the file"
            ) from None


def open_database(path: Path) -> sqlite3.Connection:
    """Open (creating or migrating) the database at `path`; StoreError when that is impossible."""
    path = Path(path)
    created = _create_private_file(path)
    try:
        connection = sqlite3.connect(path, check_same_thread=False, isolation_level=None, factory=_LockedConnection)
    except sqlite3.Error as error:
        raise _open_error(path, error) from None
    try:
        _configure(connection, path)
        _migrate(connection, path)
    except BaseException:
        connection.close()
        raise
    if created:
        os.chmod(path, FILE_MODE)
    return connection


def _create_private_file(path: Path) -> bool:
    """Create an empty 0600 file before SQLite does (SQLite would use the umask); True if new."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        if path.is_dir():
            raise StoreError(f"database {path} is a folder; move it away or choose another data folder") from None
        return False
    except OSError as error:
        raise StoreError(
            f"cannot create database {path} ({error.strerror}); "
            "check that its folder exists and is writable, or choose another with --data-dir"
        ) from None
    os.close(descriptor)
    return True


def _configure(connection: sqlite3.Connection, path: Path) -> None:
    try:
        connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        connection.execute("PRAGMA foreign_keys = ON")
        rows = connection.execute("PRAGMA quick_check").fetchall()
        connection.execute("PRAGMA journal_mode = WAL").fetchone()
    except sqlite3.Error as error:
        if getattr(error, "sqlite_errorname", "") in _DAMAGED:
            raise _damaged(connection, path, str(error)) from None
        raise _open_error(path, error) from None
    problems = [str(row[0]) for row in rows]
    if problems != ["ok"]:
        raise _damaged(connection, path, "; ".join(problems[:3]))


def _migrate(connection: sqlite3.Connection, path: Path) -> None:
    version = int(connection.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"database {path} was written by a newer chatapp (schema {version}, this one knows "
            f"{SCHEMA_VERSION}); upgrade chatapp"
        )
    for target in range(version + 1, SCHEMA_VERSION + 1):
        with transaction(connection):
            migration = MIGRATIONS[target - 1]
            if callable(migration):
                migration(connection)
            else:
                for statement in migration:
                    connection.execute(statement)
            # user_version is part of the file header, so it commits with the migration.
            connection.execute(f"PRAGMA user_version = {int(target)}")


def _open_error(path: Path, error: sqlite3.Error) -> StoreError:
    return StoreError(
        f"cannot open database {path} ({error}); check the file's permissions and that no other program holds it"
    )


def _damaged(connection: sqlite3.Connection, path: Path, reason: str) -> StoreError:
    """Copy the damaged file (and its -wal/-shm) aside and say where the copy is."""
    connection.close()
    backup = _backup_name(path)
    try:
        for suffix in ("", "-wal", "-shm"):
            source = Path(f"{path}{suffix}")
            if source.exists():
                target = Path(f"{backup}{suffix}")
                shutil.copyfile(source, target)
                os.chmod(target, FILE_MODE)
    except OSError as error:
        return StoreError(
            f"database {path} is damaged ({reason}) and no copy could be saved ({error.strerror}); "
            "copy it somewhere safe, then move it away to start a fresh database"
        )
    return StoreError(
        f"database {path} is damaged ({reason}); a copy was saved as {backup}; move it away to start a fresh database"
    )


def _backup_name(path: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate = path.with_name(f"{path.name}.corrupt-{stamp}")
    number = 2
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.corrupt-{stamp}-{number}")
        number += 1
    return candidate
