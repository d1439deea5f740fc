"""The models on this machine as `chatapp models`, the model picker and the server list them."""

from __future__ import annotations

from typing import Any

from chatapp.models.catalog import FoundModel
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
