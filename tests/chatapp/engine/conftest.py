"""Fixtures of the engine tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chatapp.engine.llama_native import NativeContext, NativeModel


@pytest.fixture(scope="module")
def loaded(model_path: Path) -> Iterator[tuple[NativeModel, NativeContext]]:
    """The bundled model and a small one-sequence context of its own, for tests that decode by hand."""
    model = NativeModel(model_path, n_gpu_layers=0)
    context = NativeContext(model, n_sequences=1, n_ctx_per_sequence=256, n_threads=2, n_batch=256)
    yield model, context
    context.close()
    model.close()
