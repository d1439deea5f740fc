"""What a GGUF model is, from its header alone: the fields `chatapp models` lists and the picker shows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from cache.memory_kinds import MemoryKind
from chatapp.models.file_types import quantization_name
from chatapp.models.gguf_header import GgufHeader

# llama.cpp's llm_arch_is_recurrent and llm_arch_is_hybrid (src/llama-arch.cpp), by architecture name.
RECURRENT_ARCHITECTURES = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID_ARCHITECTURES = frozenset(
    {
        "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe",
        "qwen3next", "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next", "qwen35", "qwen35moe", "qwen4exp",
        "deepseek4", "minimax-01",
    }
)  # fmt: skip
EMBEDDING_ARCHITECTURES = frozenset({"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "modern-bert", "neo-bert"})


class ModelUse(StrEnum):
    """What a GGUF file is for: only language models can chat."""

    CHAT = "language model"
    PROJECTOR = "projector"  # a vision or audio encoder (mmproj) that goes beside a language model
    EMBEDDING = "embedding"
    ADAPTER = "adapter"  # a LoRA
    VOCABULARY = "vocabulary only"


@dataclass(frozen=True)
class ModelSummary:
    architecture: str
    use: ModelUse
    parameters: int  # weights counted from the tensor list (all parts of a split model)
    size_label: str  # as the file names its size (general.size_label): 135M, 7B
    quantization: str
    context_length: int
    memory_kind: MemoryKind
    window: int  # tokens a sliding-window layer attends to (0: none)
    has_chat_template: bool
    name: str  # general.name

    @property
    def parameters_label(self) -> str:
        """The size as people say it: 135M, 7.2B (from the count; the file's own label when it has none)."""
        if not self.parameters:
            return self.size_label
        for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
            if self.parameters >= scale:
                value = self.parameters / scale
                return f"{value:.0f}{suffix}" if value >= 100 else f"{value:.3g}{suffix}"
        return str(self.parameters)


def summarize(parts: Sequence[GgufHeader]) -> ModelSummary:
    """The summary of a model from the headers of its files (one, or each part of a split model)."""
    first = parts[0]
    architecture = first.text("general.architecture")
    window = first.number(f"{architecture}.attention.sliding_window")
    return ModelSummary(
        architecture=architecture,
        use=_use(first, architecture),
        parameters=sum(tensor.elements for part in parts for tensor in part.tensors),
        size_label=first.text("general.size_label"),
        quantization=quantization_name(
            first.number("general.file_type") if "general.file_type" in first.metadata else None
        ),
        context_length=first.number(f"{architecture}.context_length"),
        memory_kind=MemoryKind.of(
            recurrent=architecture in RECURRENT_ARCHITECTURES,
            hybrid=architecture in HYBRID_ARCHITECTURES,
            window=window,
        ),
        window=window,
        has_chat_template=bool(first.text("tokenizer.chat_template")),
        name=first.text("general.name"),
    )


def _use(header: GgufHeader, architecture: str) -> ModelUse:
    kind = header.text("general.type")
    if kind == "mmproj" or architecture == "clip":
        return ModelUse.PROJECTOR
    if kind == "adapter" or "adapter.type" in header.metadata:
        return ModelUse.ADAPTER
    if architecture in EMBEDDING_ARCHITECTURES or header.number(f"{architecture}.pooling_type") > 0:
        return ModelUse.EMBEDDING
    if not header.tensors and header.number("split.count") <= 1:
        return ModelUse.VOCABULARY
    return ModelUse.CHAT
