"""Content fingerprints of large files, hashed once per (path, size, mtime).

The cache namespace must change whenever the model's bytes change, so the fingerprint is
a hash of the whole file, not of its name or header. A multi-gigabyte model takes seconds
to hash, so the result is remembered in a small JSON memo keyed by what `stat` reports.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path

import xxhash

from cache.atomic_file import replace_atomically

CHUNK_BYTES = 8 << 20
FINGERPRINT_PREFIX = "xxh3-128:"
# Hears the bytes hashed so far after each chunk; False stops the hash (FingerprintCancelled).
HashProgress = Callable[[int], bool]


class FingerprintCancelled(Exception):
    """The progress callback asked to stop hashing (the user gave up on loading the model)."""


def hash_file(path: Path, progress: HashProgress | None = None) -> str:
    """xxh3-128 of the file's bytes, as `xxh3-128:<hex>`."""
    digest = xxhash.xxh3_128()
    done = 0
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
            done += len(chunk)
            if progress is not None and not progress(done):
                raise FingerprintCancelled(f"hashing {path.name} was stopped")
    return FINGERPRINT_PREFIX + digest.hexdigest()


def _memo_key(path: Path) -> str:
    stat = path.stat()
    return f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"


def _read_memo(memo_file: Path) -> dict[str, str]:
    try:
        data = json.loads(memo_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {key: value for key, value in data.items() if isinstance(key, str) and isinstance(value, str)}


def _write_memo(memo_file: Path, memo: dict[str, str]) -> None:
    """Replace the memo atomically so that a crash never leaves half a file."""
    memo_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(OSError):  # a memo that cannot be written is recomputed next time
        replace_atomically(memo_file, json.dumps(memo, indent=0, sort_keys=True), durable=False)


def _remembered(memo: dict[str, str], key: str) -> str | None:
    cached = memo.get(key)
    return cached if cached is not None and cached.startswith(FINGERPRINT_PREFIX) else None


def fingerprints_remembered(paths: list[Path], memo_file: Path) -> bool:
    """Whether every file's fingerprint is in the memo (nothing to hash: a load's progress need not wait)."""
    memo = _read_memo(memo_file)
    try:
        return all(_remembered(memo, _memo_key(path)) is not None for path in paths)
    except OSError:
        return False


def file_fingerprint(path: Path, memo_file: Path | None = None, progress: HashProgress | None = None) -> str:
    """The content fingerprint of `path`, read from `memo_file` when the file is unchanged."""
    key = _memo_key(path)
    memo = _read_memo(memo_file) if memo_file is not None else {}
    if (cached := _remembered(memo, key)) is not None:
        return cached
    fingerprint = hash_file(path, progress)
    if memo_file is not None:
        path_part = key.split("|", 1)[0] + "|"
        memo = {old: value for old, value in memo.items() if not old.startswith(path_part)}
        memo[key] = fingerprint
        _write_memo(memo_file, memo)
    return fingerprint


def files_fingerprint(
    paths: list[Path], memo_file: Path | None = None, progress: Callable[[float], bool] | None = None
) -> str:
    """The fingerprint of a model kept in several files (a split GGUF): every part's bytes count, so a
    part changed behind an unchanged first one changes the namespace too. One file: its own.

    `progress` hears the share of all the parts' bytes hashed (parts remembered count as done);
    False from it stops (FingerprintCancelled) and nothing is remembered of the part being hashed."""
    sizes = [path.stat().st_size for path in paths]
    total = max(1, sum(sizes))
    fingerprints = []
    for index, path in enumerate(paths):
        before = sum(sizes[:index])
        told = None if progress is None else (lambda done, before=before: progress((before + done) / total))
        fingerprints.append(file_fingerprint(path, memo_file, told))
    if len(paths) == 1:
        return fingerprints[0]
    parts = "\n".join(fingerprints)
    return FINGERPRINT_PREFIX + "parts:" + xxhash.xxh3_128_hexdigest(parts.encode("ascii"))
