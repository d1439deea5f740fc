"""Cache upkeep that needs no model: sizes, lifetime totals, pruning, clearing.

`chatapp cache stats|prune|clear` run in their own process, so the counters of each
session are added to a small JSON file when its cache closes, and read back here.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from cache.disk_tier import UNLIMITED, _open

TOTALS_FILE = "totals.json"
_totals_lock = threading.Lock()


def read_totals(directory: Path) -> dict[str, Any]:
    try:
        data = json.loads((directory / TOTALS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def add_totals(directory: Path, session: dict[str, Any]) -> None:
    """Add one session's counters (nested dicts of numbers) to the lifetime totals."""
    with _totals_lock:
        totals = read_totals(directory)
        merged = _add(totals, session)
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=".totals.")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as stream:
                json.dump(merged, stream, indent=1, sort_keys=True)
            os.replace(temporary, directory / TOTALS_FILE)
        except OSError:
            Path(temporary).unlink(missing_ok=True)


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
        return blocks.expire(retry=True)
    finally:
        blocks.close()


def clear(directory: Path) -> int:
    """Remove every entry and its files, pinned ones too, and the totals; return how many entries."""
    removed = 0
    for name in ("blocks", "pinned"):
        if (directory / name).exists():
            store = _open(directory / name, UNLIMITED)
            try:
                removed += store.clear(retry=True)
            finally:
                store.close()
    (directory / TOTALS_FILE).unlink(missing_ok=True)
    return removed
