"""Content fingerprints of large files, hashed once per (path, size, mtime).

The cache namespace must change whenever the model's bytes change, so the fingerprint is
a hash of the whole file, not of its name or header. A multi-gigabyte model takes seconds
to hash, so the result is remembered in a small JSON memo keyed by what `stat` reports.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import xxhash

from cache.atomic_file import replace_atomically

CHUNK_BYTES = 8 << 20
FINGERPRINT_PREFIX = "xxh3-128:"


def hash_file(path: Path) -> str:
    """xxh3-128 of the file's bytes, as `xxh3-128:<hex>`."""
    digest = xxhash.xxh3_128()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
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


def file_fingerprint(path: Path, memo_file: Path | None = None) -> str:
    """The content fingerprint of `path`, read from `memo_file` when the file is unchanged."""
    key = _memo_key(path)
    memo = _read_memo(memo_file) if memo_file is not None else {}
    cached = memo.get(key)
    if cached is not None and cached.startswith(FINGERPRINT_PREFIX):
        return cached
    fingerprint = hash_file(path)
    if memo_file is not None:
        path_part = key.split("|", 1)[0] + "|"
        memo = {old: value for old, value in memo.items() if not old.startswith(path_part)}
        memo[key] = fingerprint
        _write_memo(memo_file, memo)
    return fingerprint


def files_fingerprint(paths: list[Path], memo_file: Path | None = None) -> str:
    """The fingerprint of a model kept in several files (a split GGUF): every part's bytes count, so a
    part changed behind an unchanged first one changes the namespace too. One file: its own."""
    if len(paths) == 1:
        return file_fingerprint(paths[0], memo_file)
    parts = "\n".join(file_fingerprint(path, memo_file) for path in paths)
    return FINGERPRINT_PREFIX + "parts:" + xxhash.xxh3_128_hexdigest(parts.encode("ascii"))
