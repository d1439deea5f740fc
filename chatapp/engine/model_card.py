"""What the app may know about the model behind an engine, and what that engine can do."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cache.memory_kinds import MemoryKind


@dataclass(frozen=True)
class Capabilities:
    """What an engine offers beyond streaming an answer that its facets do not show (a prompt builder:
    prompts as tokens; a cache: one to administer here), so the surfaces show only what applies."""

    generated_ids: bool  # reports the ids of the tokens it generated
    grammars: bool = False  # holds an answer to a grammar (tool calls, JSON output)


LOCAL_CAPABILITIES = Capabilities(generated_ids=True, grammars=True)


@dataclass(frozen=True)
class ModelFacts:
    """What a GGUF file says of its model, for the APIs that describe it (Ollama's /api/tags and /api/show).

    Read from the model already loaded (its metadata), never by loading the file again; a model
    behind a remote engine leaves them empty: its server does not say.
    """

    architecture: str = ""  # general.architecture: llama, qwen2, gemma3, ...
    parameters: int = 0  # how many weights (0: unknown)
    size_label: str = ""  # general.size_label, as the file names its size: 135M, 7B
    quantization: str = ""  # the file type: Q4_1, Q4_K_M, F16
    layers: int = 0  # 0: unknown


@dataclass(frozen=True)
class ModelInfo:
    """What the rest of the app may know about the loaded model and context."""

    path: Path | None  # the GGUF file; None for a model served by a remote engine
    name: str
    description: str
    n_ctx_train: int
    n_ctx_per_sequence: int
    n_sequences: int
    flash_attention: bool
    gpu_layers: int
    threads: int
    kv_type: str = "f16"  # the KV cells' number format (kv_types.py)
    device: str = "CPU"  # where offloaded layers run, as ggml names it ("CPU" when none are)
    memory_kind: MemoryKind = MemoryKind.PLAIN
    window: int = 0  # tokens a sliding-window layer attends to (0: none)
    swa_full: bool = True
    # The cells llama.cpp's sliding-window cache holds per sequence (0: no window): where a window's cells lie
    # depends on it, and so does every bit a cold run computes after the window's first wrap.
    window_cells: int = 0
    n_vocab: int = 0
    server: str | None = None  # the remote engine's address, None when the model runs here
    # What tells a served model apart when its file is not here (a hash of what the server says of
    # it); None for a local model, whose file is hashed.
    fingerprint: str | None = None
    facts: ModelFacts = ModelFacts()
    # Prompts computed in fixed batches of this many tokens, where the model's KV depends on where
    # batches end (split_rule.py); 0: anywhere.
    prompt_grid: int = 0
    flash_attention_why: str = ""  # why flash attention is on or off, in a few words (flash_choice.py)

    @property
    def short_name(self) -> str:
        """How the status line names the model: the file's stem, or the served model's name."""
        return self.path.stem if self.path is not None else self.name
