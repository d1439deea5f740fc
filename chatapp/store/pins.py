"""Pinned prefixes: which persona or document prefixes the user keeps out of eviction.

The cache pins blocks, not names; this list remembers what was pinned, under a name the
user recognises, with the exact tokens needed to unpin it later.
"""

from __future__ import annotations

import builtins
import json
import sqlite3
import time

from chatapp.records import PinRecord
from chatapp.store.database import transaction


class PinStore:
    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    def list(self) -> builtins.list[PinRecord]:
        with transaction(self._connection, write=False) as db:
            rows = db.execute("SELECT id, kind, label, tokens, created_at FROM pins ORDER BY created_at, id").fetchall()
        return [PinRecord(row[0], row[1], row[2], tuple(int(t) for t in json.loads(row[3])), row[4]) for row in rows]

    def add(self, kind: str, label: str, tokens: builtins.list[int]) -> PinRecord:
        """Remember a pin; pinning the same prefix again replaces the old entry."""
        encoded = json.dumps([int(t) for t in tokens])
        now = time.time()
        with transaction(self._connection) as db:
            db.execute("DELETE FROM pins WHERE tokens = ?", (encoded,))
            cursor = db.execute(
                "INSERT INTO pins (kind, label, tokens, created_at) VALUES (?, ?, ?, ?)", (kind, label, encoded, now)
            )
            pin_id = int(cursor.lastrowid or 0)
        return PinRecord(pin_id, kind, label, tuple(tokens), now)

    def remove(self, pin_id: int) -> None:
        with transaction(self._connection) as db:
            db.execute("DELETE FROM pins WHERE id = ?", (pin_id,))

    def clear(self) -> None:
        with transaction(self._connection) as db:
            db.execute("DELETE FROM pins")
