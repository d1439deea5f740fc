"""PinStore: pins that last and pins that end, per cache namespace, and a version 4 file's pins kept."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from chatapp.store import database
from chatapp.store.database import open_database
from chatapp.store.pins import PinStore


def test_a_request_pin_ends_and_asking_again_moves_its_end(connection: sqlite3.Connection) -> None:
    pins = PinStore(connection)
    first = pins.add("request", "through message 1", [1, 2, 3], expires_at=100.0, namespace="aa")
    assert pins.expired(99.0, "aa") == []
    assert pins.expired(100.0, "aa") == [first]
    assert pins.expired(100.0, "bb") == [], "another model's pins are its own"
    again = pins.add("request", "through message 1", [1, 2, 3], expires_at=400.0, namespace="aa")
    assert pins.list() == [again]
    assert again.expires_at == 400.0
    assert pins.expired(300.0, "aa") == []


def test_a_request_pin_never_ends_a_pin_the_user_made(connection: sqlite3.Connection) -> None:
    pins = PinStore(connection)
    lasting = pins.add("persona", "Concise", [1, 2, 3], namespace="aa")
    assert pins.add("request", "through message 1", [1, 2, 3], expires_at=100.0, namespace="aa") == lasting
    assert pins.list() == [lasting]
    assert pins.expired(1e12, "aa") == []
    # The user pinning what a request pinned makes it last.
    pins.add("request", "through message 2", [1, 2, 3, 4], expires_at=100.0, namespace="aa")
    made = pins.add("persona", "Longer", [1, 2, 3, 4], namespace="aa")
    assert made.expires_at is None
    assert len(pins.list()) == 2


def test_listing_one_namespace_keeps_the_pins_of_no_known_model(connection: sqlite3.Connection) -> None:
    pins = PinStore(connection)
    old = pins.add("persona", "From before", [5])
    mine = pins.add("request", "mine", [6], expires_at=1.0, namespace="aa")
    pins.add("request", "another model's", [7], expires_at=1.0, namespace="bb")
    assert pins.list("aa") == [old, mine]
    assert len(pins.list()) == 3


def test_a_version_4_file_keeps_its_pins_as_lasting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "chatapp.db"
    with monkeypatch.context() as old_code:
        old_code.setattr(database, "SCHEMA_VERSION", 4)
        old_code.setattr(database, "MIGRATIONS", database.MIGRATIONS[:4])
        first = open_database(path)
        with first:
            first.execute("INSERT INTO pins (kind, label, tokens, created_at) VALUES ('persona', 'Old', '[1, 2]', 0)")
        first.close()
    connection = open_database(path)
    try:
        (pin,) = PinStore(connection).list()
        assert (pin.label, pin.tokens, pin.expires_at, pin.namespace) == ("Old", (1, 2), None, "")
    finally:
        connection.close()
