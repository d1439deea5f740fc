"""A fresh database file per test."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from chatapp.store.database import open_database


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "chatapp.db"


@pytest.fixture
def connection(db_path: Path) -> Iterator[sqlite3.Connection]:
    connection = open_database(db_path)
    yield connection
    connection.close()
