"""The engine contract: what the services, the screens and the server may ask of any engine.

Two engines stand behind it: the in-process llama.cpp engine (engine.py, with its tiered
prefix cache) and a remote server (remote.py: llama-server or another `chatapp serve`).
Callers start an answer from prompt tokens, sampling and hints (a GenerationRequest), read
its events from a GenerationHandle (cancel, wait), and read the model card and capability
flags to show only what applies. llama.cpp specifics stay behind it.

This module is the engine's door: the services import the engine's types from here and from
nowhere else in chatapp.engine, but for the one place that opens engines
(services/startup.py, through chatapp.engine.opening). `make lint` holds it (import-linter).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from cache.prefix_cache import PrefixCache
from chatapp.engine.events import (
    AnswerText,
    GenerationResult,
    GenerationStats,
    PromptProgress,
    PromptReuse,
    RestoreTimings,
    StreamEvent,
)
from chatapp.engine.handle import GenerationHandle
from chatapp.engine.llama_native import build_name
from chatapp.engine.model_card import Capabilities, ModelFacts, ModelInfo
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.engine.restore_costs import RestoreCosts
from chatapp.prompting.prompt import PromptBuilder

__all__ = [  # the door: what code outside chatapp.engine may name
    "AnswerText",
    "Capabilities",
    "EngineClient",
    "GenerationHandle",
    "GenerationRequest",
    "GenerationResult",
    "GenerationStats",
    "LocalEngine",
    "ModelFacts",
    "ModelInfo",
    "PromptProgress",
    "PromptReuse",
    "RestoreTimings",
    "SamplingParams",
    "StreamEvent",
    "build_name",  # the llama.cpp build and CPU: logits compare bit for bit within one (restore checks)
]


class EngineClient(Protocol):
    """An engine that answers prompts; safe to call from any thread."""

    @property
    def info(self) -> ModelInfo:
        """The model card: name, context per conversation, where it runs."""
        ...

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def prompt_builder(self) -> PromptBuilder | None:
        """The tokenizing facet: renders conversations with the model's own template, tokenizes and
        detokenizes with its vocabulary.

        None when the server builds its prompts from messages (a chat API): it shares no tokenizer,
        and requests carry their messages.
        """
        ...

    @property
    def takes_checkpoints(self) -> bool:
        """Whether requests should name their reuse boundaries (models whose state cannot be cut)."""
        ...

    @property
    def cache(self) -> PrefixCache | None:
        """The local prefix cache to administer; None when off or when the cache is the server's."""
        ...

    @property
    def cache_problem(self) -> str | None:
        """Why the local cache is off, in one line (None when it is on or does not apply)."""
        ...

    @property
    def restore_costs(self) -> RestoreCosts | None:
        """The measured speeds behind restore-or-compute (local engines only)."""
        ...

    def generate(self, request: GenerationRequest) -> GenerationHandle:
        """Start an answer; ContextOverflowError when the prompt does not fit, GrammarError when the
        engine cannot hold the answer to its grammar (both before any prompt is computed)."""
        ...

    def flush_cache(self) -> None:
        """Wait until every answer so far is stored (a no-op where the cache is the server's)."""
        ...

    def forget_cached(self, prompts: Sequence[Sequence[int]], keep: Sequence[Sequence[int]] = ()) -> int:
        """Remove what requests beginning as `prompts` left in this process and its cache folder that none of
        `keep` uses (a deleted conversation's text); how many entries went (0 where the cache is the server's)."""
        ...

    def close(self) -> None:
        """Cancel what runs and free the engine."""
        ...


class LocalEngine(EngineClient, Protocol):
    """The in-process engine's extras for the bench's measurements."""

    def drop_ready_states(self) -> None:
        """Forget the whole states kept ready, so a restore goes through the cache's blocks."""
        ...
