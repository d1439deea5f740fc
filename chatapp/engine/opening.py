"""Where engines come from: the composition root's one door into chatapp.engine.

The services ask here for an engine behind the contract (the in-process llama.cpp engine or
a remote server, remote.py) and for a prompt builder without weights (the bench); they never import
the engine class or llama_native themselves.
"""

from __future__ import annotations

from pathlib import Path

import llama_cpp

from chatapp.engine.contract import EngineClient, LocalEngine
from chatapp.engine.engine import CacheFactory, Engine, EngineConfig, default_thread_count
from chatapp.engine.llama_native import NativeModel
from chatapp.engine.prompt import PromptBuilder
from chatapp.engine.remote import RemoteConfig, RemoteEngine

__all__ = [
    "CacheFactory",
    "EngineConfig",
    "RemoteConfig",
    "connect_remote_engine",
    "default_thread_count",
    "library_version",
    "open_prompt_builder",
    "start_local_engine",
]


def start_local_engine(config: EngineConfig, cache_factory: CacheFactory | None = None) -> LocalEngine:
    """Load the model in this process; its KV prefixes go to the cache the factory opens."""
    return Engine(config, cache_factory)


def connect_remote_engine(config: RemoteConfig) -> EngineClient:
    """An engine on a server (llama-server, `chatapp serve`); RemoteEngineError when it cannot be used."""
    return RemoteEngine(config)


def open_prompt_builder(model_path: Path) -> PromptBuilder:
    """A prompt builder from the model's vocabulary alone (no weights, no context): for the bench."""
    return PromptBuilder.for_model(NativeModel(model_path, vocab_only=True))


def library_version() -> str:
    """The llama.cpp binding's version: part of every cache key (state bytes change between releases)."""
    return str(llama_cpp.__version__)
