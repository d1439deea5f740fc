"""Fixtures of the bench tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight llama (tests/model_factory.py), written once per test module."""
    from tests.model_factory import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("model") / "tiny.gguf")
