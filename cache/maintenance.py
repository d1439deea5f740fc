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
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import diskcache

from cache.atomic_file import replace_atomically
from cache.blocks import record_namespace
from cache.disk_tier import UNLIMITED, clear_store, open_bytes_store, remove_orphan_files
from cache.request_log import remove_log

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

TOTALS_FILE = "totals.json"
MEMORY_FILE = "memory.json"  # how the last model that used this folder keeps its state
NAMESPACES_FILE = "namespaces.json"  # what each namespace belongs to, as the app described it
LOCK_FILE = ".totals.lock"
CHECKS_FOLDER = "restore-checks"  # restore_checks.py: one record per namespace, its sampled prompts
_totals_lock = threading.Lock()


def read_totals(directory: Path) -> dict[str, Any]:
    return _read_json(directory / TOTALS_FILE)


def _read_json(path: Path) -> dict[str, Any]:
    """A small JSON object the cache keeps beside its stores; {} when missing or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def remember_memory(directory: Path, description: dict[str, Any]) -> None:
    """Note the memory kind of the model now using the folder, for `cache stats` without a model."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    replace_atomically(directory / MEMORY_FILE, json.dumps(description, sort_keys=True), durable=False)


def read_memory(directory: Path) -> dict[str, Any]:
    return _read_json(directory / MEMORY_FILE)


def remember_namespace(directory: Path, namespace_id: str, label: dict[str, Any]) -> None:
    """Note what a namespace's entries belong to (the app's words: a model's name and file), for the
    stats and clearing by model without loading it."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    with file_lock(directory / LOCK_FILE):
        known = _read_json(directory / NAMESPACES_FILE)
        if known.get(namespace_id) == label:
            return
        known[namespace_id] = label
        replace_atomically(directory / NAMESPACES_FILE, json.dumps(known, sort_keys=True), durable=False)


def read_namespaces(directory: Path) -> dict[str, dict[str, Any]]:
    """namespace id -> the label the app gave it."""
    return {key: value for key, value in _read_json(directory / NAMESPACES_FILE).items() if isinstance(value, dict)}


def usage_by_namespace(directory: Path) -> dict[str, dict[str, int]]:
    """namespace id -> entries and bytes stored (pinned ones too); records that name none are left out."""
    usage: dict[str, dict[str, int]] = {}
    for name in STORES:
        if not (directory / name).exists():
            continue
        with _opened(directory / name) as store:
            rows = store._sql("SELECT tag, size + IFNULL(LENGTH(value), 0) FROM Cache WHERE tag IS NOT NULL")
            for tag, size in rows.fetchall():
                namespace = record_namespace(bytes(tag))
                if namespace is None:
                    continue
                entry = usage.setdefault(namespace.hex(), {"entries": 0, "bytes": 0})
                entry["entries"] += 1
                entry["bytes"] += int(size or 0)
    return usage


def clear_namespaces(directory: Path, namespace_ids: set[str]) -> int:
    """Remove every entry (pinned ones too) of these namespaces; the others stay. Returns how many."""
    removed = 0
    for name in STORES:
        if not (directory / name).exists():
            continue
        with _opened(directory / name) as store:
            rows = store._sql("SELECT key, tag FROM Cache WHERE tag IS NOT NULL").fetchall()
            for key, tag in rows:
                namespace = record_namespace(bytes(tag))
                if namespace is not None and namespace.hex() in namespace_ids and store.delete(key, retry=True):
                    removed += 1
    for namespace_id in namespace_ids:
        (directory / CHECKS_FOLDER / f"{namespace_id}.json").unlink(missing_ok=True)
    return removed


def add_totals(directory: Path, session: dict[str, Any]) -> None:
    """Add one session's counters (nested dicts of numbers) to the lifetime totals.

    Two processes closing at once must not lose each other's counts: the read-add-replace
    runs under a lock file (flock) as well as a thread lock. Raises OSError when the folder
    cannot be written.
    """
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _totals_lock, file_lock(directory / LOCK_FILE):
        merged = _add(read_totals(directory), session)
        replace_atomically(directory / TOTALS_FILE, json.dumps(merged, indent=1, sort_keys=True), durable=False)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
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


STORES = ("blocks", "pinned")


@contextlib.contextmanager
def _opened(folder: Path) -> Iterator[diskcache.Cache]:
    store = open_bytes_store(folder, UNLIMITED)
    try:
        yield store
    finally:
        store.close()


def disk_usage(directory: Path) -> dict[str, int]:
    """Entries and bytes stored (every model and namespace), pinned ones apart."""
    if not (directory / "blocks").exists():
        return {"entries": 0, "bytes": 0, "pinned_entries": 0, "pinned_bytes": 0}
    with _opened(directory / "blocks") as blocks, _opened(directory / "pinned") as pinned:
        return {
            "entries": len(blocks) + len(pinned),
            "bytes": blocks.volume() + pinned.volume(),
            "pinned_entries": len(pinned),
            "pinned_bytes": pinned.volume(),
        }


def prune(directory: Path) -> int:
    """Drop expired entries (pinned ones never expire) and old orphan files now; return how many entries."""
    expired = 0
    for name in STORES:
        if (directory / name).exists():
            with _opened(directory / name) as store:
                expired += store.expire(retry=True) if name == "blocks" else 0
                remove_orphan_files(store)
    return expired


def clear(directory: Path) -> int:
    """Remove every entry and its files, pinned ones too, the totals, the request log and the restore checks;
    return how many entries.

    Payload files no row names (left by a process killed between writing a file and
    committing its row) are removed too, as are folders set aside as damaged.
    """
    removed = 0
    for name in STORES:
        if not (directory / name).exists():
            continue
        try:
            with _opened(directory / name) as store:
                removed += clear_store(store)
        except sqlite3.DatabaseError as error:
            if isinstance(error, sqlite3.OperationalError):
                raise
            shutil.rmtree(directory / name)  # too damaged to open: nothing in it can be kept anyway
    for damaged in directory.glob("*.damaged-*"):
        shutil.rmtree(damaged, ignore_errors=True)
    (directory / TOTALS_FILE).unlink(missing_ok=True)
    (directory / MEMORY_FILE).unlink(missing_ok=True)
    shutil.rmtree(directory / CHECKS_FOLDER, ignore_errors=True)  # the sampled prompts are content too
    remove_log(directory)
    return removed
