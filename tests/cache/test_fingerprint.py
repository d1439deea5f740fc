"""Model fingerprints: a hash of the content, remembered per path, size and mtime."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cache.fingerprint import file_fingerprint, hash_file


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
