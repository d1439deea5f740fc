"""Model files: the bundled model is found, and bad paths fail with the fix."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from chatapp.engine.llama_native import NativeModel
from chatapp.errors import ModelError
from chatapp.model_files import bundled_model_path, check_gguf_file
from chatapp.models.machine import resolve_model


def test_bundled_model_is_found_without_its_plugin_host() -> None:
    path = bundled_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size > 90_000_000
    assert resolve_model(None) == path.resolve()


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda folder: folder / "missing.gguf", "does not exist"),
        (lambda folder: folder, "is a folder"),
        (lambda folder: _write(folder / "notes.gguf", b"hello world, not a model at all"), "not a GGUF model"),
        (lambda folder: _write(folder / "short.gguf", b"GGUF\x03\x00"), "truncated"),
    ],
)
def test_bad_model_paths(tmp_path: Path, setup, message: str) -> None:
    with pytest.raises(ModelError, match=message) as caught:
        check_gguf_file(setup(tmp_path))
    assert "\n" not in str(caught.value)


def test_truncated_real_model_is_refused_by_llama_cpp(tmp_path: Path, model_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    with model_path.open("rb") as source, cut.open("wb") as target:
        shutil.copyfileobj(source, target, length=1 << 20)
        target.truncate(4 << 20)
    check_gguf_file(cut)  # the header is fine...
    with pytest.raises(ModelError, match="could not load"):
        NativeModel(cut)  # ...but llama.cpp finds the tensors missing


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
