"""Pinned prefixes: which prefixes are kept out of eviction, and until when.

The cache pins blocks, not names; this list remembers what was pinned, under a name the
user recognises, with the exact tokens needed to unpin it later. A pin the user made lasts
until unpinned; one a request asked for (Anthropic's `cache_control`) ends at `expires_at`,
and asking again moves that end.
"""

from __future__ import annotations

import builtins
import json
import sqlite3
import time

from chatapp.records import PinRecord
from chatapp.store.database import transaction

_COLUMNS = "id, kind, label, tokens, created_at, expires_at, namespace"


class PinStore:
    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    def list(self, namespace: str | None = None) -> builtins.list[PinRecord]:
        """Every pin, oldest first; with `namespace`, only that model's (and those of no known model)."""
        where, values = ("WHERE namespace IN (?, '')", (namespace,)) if namespace is not None else ("", ())
        with transaction(self._connection, write=False) as db:
            rows = db.execute(f"SELECT {_COLUMNS} FROM pins {where} ORDER BY created_at, id", values).fetchall()
        return [_record(row) for row in rows]

    def add(
        self,
        kind: str,
        label: str,
        tokens: builtins.list[int],
        *,
        expires_at: float | None = None,
        namespace: str = "",
    ) -> PinRecord:
        """Remember a pin; pinning the same prefix again replaces the old entry, except that a pin
        which ends never replaces one that does not (a request's hint does not undo the user's pin)."""
        encoded = json.dumps([int(t) for t in tokens])
        now = time.time()
        with transaction(self._connection) as db:
            if expires_at is not None:
                lasting = db.execute(
                    f"SELECT {_COLUMNS} FROM pins WHERE tokens = ? AND namespace = ? AND expires_at IS NULL",
                    (encoded, namespace),
                ).fetchone()
                if lasting is not None:
                    return _record(lasting)
            db.execute("DELETE FROM pins WHERE tokens = ? AND namespace = ?", (encoded, namespace))
            cursor = db.execute(
                "INSERT INTO pins (kind, label, tokens, created_at, expires_at, namespace) VALUES (?, ?, ?, ?, ?, ?)",
                (kind, label, encoded, now, expires_at, namespace),
            )
            pin_id = int(cursor.lastrowid or 0)
        return PinRecord(pin_id, kind, label, tuple(tokens), now, expires_at, namespace)

    def expired(self, now: float, namespace: str) -> builtins.list[PinRecord]:
        """The pins of `namespace` whose end has passed."""
        with transaction(self._connection, write=False) as db:
            rows = db.execute(
                f"SELECT {_COLUMNS} FROM pins WHERE namespace = ? AND expires_at IS NOT NULL AND expires_at <= ?",
                (namespace, now),
            ).fetchall()
        return [_record(row) for row in rows]

    def remove(self, pin_id: int) -> None:
        with transaction(self._connection) as db:
            db.execute("DELETE FROM pins WHERE id = ?", (pin_id,))

    def clear(self) -> None:
        with transaction(self._connection) as db:
            db.execute("DELETE FROM pins")


def _record(row: tuple[object, ...]) -> PinRecord:
    pin_id, kind, label, tokens, created_at, expires_at, namespace = row
    return PinRecord(
        int(pin_id),  # type: ignore[call-overload]
        str(kind),
        str(label),
        tuple(int(t) for t in json.loads(str(tokens))),
        float(created_at),  # type: ignore[arg-type]
        float(expires_at) if expires_at is not None else None,  # type: ignore[arg-type]
        str(namespace),
    )
