"""The served model in Ollama's words: /api/tags, /api/show and /api/ps describe it from one card.

Clients read these before a chat: oterm and Open WebUI show the family, size and
quantization, enable tools from `capabilities`, and take the context length from /api/ps.
What the GGUF does not say (or a remote engine's server) stays empty, as Ollama leaves it.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from chatapp.services.serving import ModelCard

# Every model served here can answer with tool calls: the server parses them from its output.
CAPABILITIES = ["completion", "tools"]
# A model kept loaded until the server stops: Ollama's "never expires" is a date far ahead.
NEVER = "2318-01-01T00:00:00Z"
MILLION, BILLION = 1_000_000, 1_000_000_000


def tagged(name: str) -> str:
    """Ollama's full model name: with a tag (`:latest` unless it has one)."""
    return name if ":" in name else f"{name}:latest"


def timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def parameter_size(model: ModelCard) -> str:
    """The size as the file labels it (135M), else from the parameter count as Ollama writes it (134.52M)."""
    facts = model.facts
    if facts.size_label:
        return facts.size_label
    count = facts.parameters
    if count >= BILLION:
        return f"{count / BILLION:.0f}B" if count % BILLION == 0 else f"{count / BILLION:.1f}B"
    if count >= MILLION:
        return f"{count / MILLION:.0f}M" if count % MILLION == 0 else f"{count / MILLION:.2f}M"
    return str(count) if count else ""


def details(model: ModelCard) -> dict[str, Any]:
    family = model.facts.architecture
    return {
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family] if family else None,
        "parameter_size": parameter_size(model),
        "quantization_level": model.facts.quantization,
    }


def tag(name: str, model: ModelCard) -> dict[str, Any]:
    """One entry of /api/tags."""
    return {
        "name": tagged(name),
        "model": tagged(name),
        "modified_at": timestamp(model.created),
        "size": model.size_bytes,
        "digest": model.fingerprint,
        "details": details(model),
    }


def running(name: str, model: ModelCard, expires_in_s: float | None = None) -> dict[str, Any]:
    """One entry of /api/ps: loaded until `expires_in_s` from now (None: while the server runs), with the
    context it serves."""
    expires = NEVER if expires_in_s is None else timestamp(time.time() + expires_in_s)
    return {
        "name": tagged(name),
        "model": tagged(name),
        "size": model.size_bytes,
        "digest": model.fingerprint,
        "details": details(model),
        "expires_at": expires,
        "size_vram": model.gpu_bytes,
        "context_length": model.context_tokens,
    }


def shown(model: ModelCard) -> dict[str, Any]:
    """/api/show: the details, the GGUF's own keys Ollama repeats in `model_info`, the template."""
    facts = model.facts
    info: dict[str, Any] = {"general.name": model.name}
    if facts.architecture:
        info["general.architecture"] = facts.architecture
        # The context this server gives a conversation: what a client can fill.
        info[f"{facts.architecture}.context_length"] = model.context_tokens
    if facts.parameters:
        info["general.parameter_count"] = facts.parameters
    if facts.size_label:
        info["general.size_label"] = facts.size_label
    info["general.context_length"] = model.context_tokens
    return {
        "modelfile": "",
        "parameters": "",
        "template": model.template,
        "details": details(model),
        "model_info": info,
        "capabilities": CAPABILITIES,
        "modified_at": timestamp(model.created),
    }
