"""The models on this machine as `chatapp models`, the model picker and the server list them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import xxhash

from chatapp.engine.contract import ModelFacts
from chatapp.models.catalog import FoundModel
from chatapp.models.gguf_header import GgufError, read_header
from chatapp.services.serving import ModelCard
from chatapp.services.units import byte_size

COLUMNS = ("NAME", "FAMILY", "PARAMS", "QUANT", "CONTEXT", "MEMORY", "SIZE", "PATH")


def model_row(model: FoundModel) -> tuple[str, ...]:
    """One model's fields as shown: what it is, how big, and where its file lies (or why it cannot load)."""
    summary = model.summary
    if summary is None:
        return (model.name, "?", "", "", "", "", byte_size(model.size_bytes), f"{model.path}  ({model.problem})")
    use = "" if model.can_chat else f"  ({model.problem or summary.use.value})"
    return (
        model.name,
        summary.architecture,
        summary.parameters_label,
        summary.quantization,
        f"{summary.context_length:,}" if summary.context_length else "",
        summary.memory_kind.value,
        byte_size(model.size_bytes),
        f"{model.path}{use}",
    )


def format_models(models: list[FoundModel]) -> str:
    """A table that fits a terminal: aligned columns, the path last (it is the longest)."""
    if not models:
        return (
            "no GGUF models found (looked in Ollama's, LM Studio's, the Hugging Face cache's and llama.cpp's "
            "folders); add folders with the model_folders setting, or pass --model PATH"
        )
    rows = [COLUMNS, *(model_row(model) for model in models)]
    widths = [max(len(row[index]) for row in rows) for index in range(len(COLUMNS) - 1)]
    return "\n".join(
        "  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]]).rstrip()
        for row in rows
    )


def model_record(model: FoundModel) -> dict[str, Any]:
    """One model as JSON (`chatapp models --json`)."""
    summary = model.summary
    record: dict[str, Any] = {
        "name": model.name,
        "source": model.source,
        "path": str(model.path),
        "parts": [str(part) for part in model.parts],
        "size_bytes": model.size_bytes,
        "can_chat": model.can_chat,
        "problem": model.problem or None,
    }
    if summary is not None:
        record |= {
            "use": summary.use.value,
            "family": summary.architecture,
            "parameters": summary.parameters,
            "parameter_size": summary.parameters_label,
            "quantization": summary.quantization,
            "context_length": summary.context_length,
            "memory": summary.memory_kind.value,
            "sliding_window": summary.window,
            "chat_template": summary.has_chat_template,
        }
    return record


def found_card(model: FoundModel, *, with_template: bool = False) -> ModelCard:
    """A model not loaded yet as the APIs list it: what its header says (its fingerprint comes with
    loading; the digest here tells files apart by where they are, their size and their time), its
    chat template read again from the header when asked (it is not kept: it can be long)."""
    summary = model.summary
    try:
        created = int(model.path.stat().st_mtime)
    except OSError:
        created = 0
    digest = xxhash.xxh3_128_hexdigest(f"{model.path}\0{model.size_bytes}\0{created}".encode())
    facts = ModelFacts()
    if summary is not None:
        facts = ModelFacts(
            architecture=summary.architecture,
            parameters=summary.parameters,
            size_label=summary.size_label,
            quantization=summary.quantization,
        )
    return ModelCard(
        id=model.name,
        name=summary.name if summary is not None and summary.name else model.name,
        path=str(model.path),
        fingerprint=digest,
        context_tokens=summary.context_length if summary is not None else 0,
        created=created,
        size_bytes=model.size_bytes,
        facts=facts,
        template=_template(model.path) if with_template else "",
        gpu_bytes=0,
    )


def _template(path: Path) -> str:
    try:
        return read_header(path).text("tokenizer.chat_template")
    except (GgufError, OSError, ValueError):
        return ""
