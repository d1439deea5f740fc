"""The GGUF header reader on damaged and hostile files: one clear problem each, never a hang or a crash."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from chatapp.models.catalog import ModelCatalog
from chatapp.models.gguf_header import GgufError, read_header
from chatapp.models.places import Layout, ModelPlace


def header(*fields: bytes, tensors: int = 0, count: int | None = None) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, len(fields) if count is None else count) + b"".join(fields)


def key(name: str) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode()


def test_counts_larger_than_the_file_are_refused_at_once(tmp_path: Path) -> None:
    huge_array = key("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2**62)  # 2^62 strings
    (tmp_path / "array.gguf").write_bytes(header(huge_array) + bytes(1024))
    (tmp_path / "keys.gguf").write_bytes(header(count=2**40))
    for name in ("array.gguf", "keys.gguf"):
        with pytest.raises(GgufError, match="damaged"):
            read_header(tmp_path / name)


def test_nested_arrays_and_odd_numbers_do_not_crash(tmp_path: Path) -> None:
    nested = key("deep") + struct.pack("<I", 9) + (struct.pack("<IQ", 9, 1) * 50) + struct.pack("<IQ", 4, 0)
    (tmp_path / "nested.gguf").write_bytes(header(nested))
    with pytest.raises(GgufError, match="nested"):
        read_header(tmp_path / "nested.gguf")
    not_a_number = key("llama.context_length") + struct.pack("<If", 6, float("nan"))
    (tmp_path / "nan.gguf").write_bytes(header(not_a_number))
    assert read_header(tmp_path / "nan.gguf").number("llama.context_length") == 0


def test_a_fifo_named_gguf_is_listed_as_a_problem_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.gguf")
    (model,) = ModelCatalog([ModelPlace("folder", tmp_path, Layout.FILES)]).models()
    assert "is not a regular file" in model.problem
