"""Model fingerprints: a hash of the content, remembered per path, size and mtime."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from cache.fingerprint import (
    CHUNK_BYTES,
    FingerprintCancelled,
    file_fingerprint,
    files_fingerprint,
    fingerprints_remembered,
    hash_file,
)


def test_fingerprint_follows_content_not_name(tmp_path: Path) -> None:
    first, renamed, changed = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    first.write_bytes(b"GGUF" + b"x" * 1000)
    renamed.write_bytes(b"GGUF" + b"x" * 1000)
    changed.write_bytes(b"GGUF" + b"x" * 999 + b"y")
    assert hash_file(first) == hash_file(renamed) != hash_file(changed)
    assert hash_file(first).startswith("xxh3-128:")


def test_memo_is_used_until_the_file_changes(tmp_path: Path) -> None:
    model, memo = tmp_path / "m.gguf", tmp_path / "memo.json"
    model.write_bytes(b"one")
    real = file_fingerprint(model, memo)
    assert real == hash_file(model)
    # Prove the memo is read: plant a value for the unchanged file.
    planted = {key: "xxh3-128:planted" for key in json.loads(memo.read_text())}
    memo.write_text(json.dumps(planted))
    assert file_fingerprint(model, memo) == "xxh3-128:planted"
    # A changed file (new size and mtime) is hashed again, and its old entry dropped.
    model.write_bytes(b"two!")
    os.utime(model, ns=(1, 10**18))
    assert file_fingerprint(model, memo) == hash_file(model)
    assert len(json.loads(memo.read_text())) == 1


def test_corrupt_memo_is_ignored(tmp_path: Path) -> None:
    model, memo = tmp_path / "m.gguf", tmp_path / "memo.json"
    model.write_bytes(b"content")
    memo.write_text("{not json")
    assert file_fingerprint(model, memo) == hash_file(model)


def test_hashing_reports_its_progress_and_stops_when_told(tmp_path: Path) -> None:
    """A split model's parts count as one progress; a stop leaves nothing remembered of the part."""
    parts = [tmp_path / "m-00001-of-00002.gguf", tmp_path / "m-00002-of-00002.gguf"]
    parts[0].write_bytes(b"a" * (CHUNK_BYTES + 10))  # two chunks
    parts[1].write_bytes(b"b" * 10)
    memo = tmp_path / "memo.json"
    shares: list[float] = []
    assert not fingerprints_remembered(parts, memo)
    whole = files_fingerprint(parts, memo, noting(shares))
    total = CHUNK_BYTES + 20
    assert shares == [CHUNK_BYTES / total, (CHUNK_BYTES + 10) / total, 1.0]
    assert fingerprints_remembered(parts, memo)
    assert files_fingerprint(parts, memo, lambda share: False) == whole, "remembered: nothing hashed"

    memo.unlink()
    with pytest.raises(FingerprintCancelled):
        files_fingerprint(parts, memo, lambda share: share < 0.5)
    assert not memo.exists(), "a part stopped half-way is not remembered"


def noting(shares: list[float]) -> Callable[[float], bool]:
    """A progress callback that notes each share and goes on."""

    def note(share: float) -> bool:
        shares.append(share)
        return True

    return note
