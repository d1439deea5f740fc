"""Cache upkeep that needs no model: sizes, lifetime totals, pruning, clearing.

`chatapp cache stats|prune|clear` run in their own process, so the counters of each
session are added to a small JSON file when its cache closes, and read back here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

from cache.disk_tier import UNLIMITED, _open

TOTALS_FILE = "totals.json"
LOCK_FILE = ".totals.lock"
_totals_lock = threading.Lock()


def read_totals(directory: Path) -> dict[str, Any]:
    try:
        data = json.loads((directory / TOTALS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def add_totals(directory: Path, session: dict[str, Any]) -> None:
    """Add one session's counters (nested dicts of numbers) to the lifetime totals.

    Two processes closing at once must not lose each other's counts: the read-add-replace
    runs under a lock file (flock) as well as a thread lock. Raises OSError when the folder
    cannot be written.
    """
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _totals_lock, _file_lock(directory / LOCK_FILE):
        merged = _add(read_totals(directory), session)
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=".totals.")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as stream:
                json.dump(merged, stream, indent=1, sort_keys=True)
            os.replace(temporary, directory / TOTALS_FILE)
        except OSError:
            Path(temporary).unlink(missing_ok=True)
            raise


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock between processes (a no-op where flock does not exist)."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if fcntl is not None:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing releases the lock


def _add(left: dict[str, Any], right: dict[str, Any]) -> dict[str, Any]:
    result = dict(left)
    for key, value in right.items():
        if isinstance(value, dict):
            result[key] = _add(result.get(key, {}) if isinstance(result.get(key), dict) else {}, value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            previous = result.get(key, 0)
            result[key] = (previous if isinstance(previous, (int, float)) else 0) + value
    return result


def disk_usage(directory: Path) -> dict[str, int]:
    """Entries and bytes stored (every model and namespace), pinned ones apart."""
    if not (directory / "blocks").exists():
        return {"entries": 0, "bytes": 0, "pinned_entries": 0, "pinned_bytes": 0}
    blocks, pinned = _open(directory / "blocks", UNLIMITED), _open(directory / "pinned", UNLIMITED)
    try:
        return {
            "entries": len(blocks) + len(pinned),
            "bytes": blocks.volume() + pinned.volume(),
            "pinned_entries": len(pinned),
            "pinned_bytes": pinned.volume(),
        }
    finally:
        blocks.close()
        pinned.close()


def prune(directory: Path) -> int:
    """Drop expired entries now; return how many."""
    if not (directory / "blocks").exists():
        return 0
    blocks = _open(directory / "blocks", UNLIMITED)
    try:
        expired = blocks.expire(retry=True)
    finally:
        blocks.close()
    for name in ("blocks", "pinned"):
        if (directory / name).exists():
            remove_orphan_files(directory / name)
    return expired


def clear(directory: Path) -> int:
    """Remove every entry and its files, pinned ones too, and the totals; return how many entries.

    Payload files no row names (left by a process killed between writing a file and
    committing its row) are removed too, as are folders set aside as damaged.
    """
    removed = 0
    for name in ("blocks", "pinned"):
        if not (directory / name).exists():
            continue
        try:
            store = _open(directory / name, UNLIMITED)
        except sqlite3.DatabaseError as error:
            if isinstance(error, sqlite3.OperationalError):
                raise
            shutil.rmtree(directory / name)  # too damaged to open: nothing in it can be kept anyway
            continue
        try:
            removed += store.clear(retry=True)
        finally:
            store.close()
        remove_orphan_files(directory / name, min_age_seconds=0)
    for damaged in directory.glob("*.damaged-*"):
        shutil.rmtree(damaged, ignore_errors=True)
    (directory / TOTALS_FILE).unlink(missing_ok=True)
    return removed


def remove_orphan_files(store_directory: Path, min_age_seconds: float = 600) -> int:
    """Delete payload files (*.val) that no row of the store's database names; return how many.

    Another process writes a payload file a moment before it commits the row naming it, so
    only files older than `min_age_seconds` are taken as orphans.
    """
    cutoff = time.time() - min_age_seconds
    store = _open(store_directory, UNLIMITED)
    try:
        named = {row[0] for row in store._sql("SELECT filename FROM Cache WHERE filename IS NOT NULL").fetchall()}  # noqa: SLF001
    finally:
        store.close()
    orphans = [
        path for path in store_directory.rglob("*.val")
        if str(path.relative_to(store_directory)) not in named and path.stat().st_mtime <= cutoff
    ]
    for path in orphans:
        path.unlink(missing_ok=True)
    return len(orphans)
