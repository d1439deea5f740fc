"""Damage a stored payload where it lies (in its row, a file of its own, or a slice of a segment), as a
failing disk or a hostile hand would."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from cache.segments import parse_slice


def _row(folder: Path, key: bytes) -> tuple[str | None, bytes | None]:
    with sqlite3.connect(folder / "blocks" / "cache.db") as database:
        row = database.execute("SELECT filename, value FROM Cache WHERE key = ?", (key.hex(),)).fetchone()
    assert row is not None
    filename: str | None = row[0]
    value: bytes | None = row[1]
    return filename, value


def _set_row(folder: Path, key: bytes, column: str, value: object) -> None:
    with sqlite3.connect(folder / "blocks" / "cache.db") as database:
        database.execute(f"UPDATE Cache SET {column} = ? WHERE key = ?", (value, key.hex()))


def payload_place(store: Path, filename: str) -> tuple[Path, int, int | None]:
    """The file a row's payload lies in, and where in it: from, and up to (None: the file's end)."""
    piece = parse_slice(filename)
    if piece is None:
        return store / filename, 0, None
    return store / piece.segment, piece.offset, piece.offset + piece.size


def stored_in_file(folder: Path, key: bytes) -> bool:
    """Whether the payload lies in a file (its own or a segment's slice), not in its row."""
    return _row(folder, key)[0] is not None


def flip_two_bytes(folder: Path, key: bytes) -> None:
    """Bytes 3 and 4 of the payload inverted."""
    filename, value = _row(folder, key)
    if filename is None:
        assert value is not None
        _set_row(folder, key, "value", value[:3] + bytes(b ^ 0xFF for b in value[3:5]) + value[5:])
        return
    path, offset, _end = payload_place(folder / "blocks", filename)
    with path.open("r+b") as handle:
        handle.seek(offset + 3)
        original = handle.read(2)
        handle.seek(offset + 3)
        handle.write(bytes(b ^ 0xFF for b in original))


def truncate(folder: Path, key: bytes) -> None:
    """The payload cut to 5 bytes: its row's value, its own file, or (in a segment) the slice its row names."""
    filename, value = _row(folder, key)
    if filename is None:
        assert value is not None
        _set_row(folder, key, "value", value[:5])
        return
    piece = parse_slice(filename)
    if piece is None:
        os.truncate(folder / "blocks" / filename, 5)
        return
    _set_row(folder, key, "filename", f"{piece.segment}#{piece.offset}+5")
