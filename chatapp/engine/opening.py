"""Where engines come from: the composition root's door into chatapp.engine, and the bench's.

The services ask here for an engine behind the contract (the in-process llama.cpp engine or
a remote server, remote.py) and for a prompt builder without weights (the bench); they never import
the engine class or llama_native themselves. The bench also finds here the engine's figures it
measures against (flash attention's rule, the tokens every answer computes, a batch's cost): with
the contract, the only modules of chatapp.engine that code outside it names (`make lint`, and for tools/
tests/test_tools.py). The measurement tools find here what they measure below the contract: the
engine itself, llama.cpp's bare contexts and the batch probe.
"""

from __future__ import annotations

from pathlib import Path

import llama_cpp

from chatapp.engine.batch_cost import PROMPTS_TOGETHER, prompts_together_ratio
from chatapp.engine.batch_probe import ProbeSettings, probe
from chatapp.engine.batching import FLASH_ATTENTION_ROWS as FLASH_ATTENTION_ROWS  # for the settings that open engines
from chatapp.engine.config import (
    CacheFactory,
    EngineConfig,
    FlashSetting,
    LoadProgress,
    default_thread_count,
    split_progress,
)
from chatapp.engine.contract import EngineClient, LocalEngine
from chatapp.engine.engine import Engine
from chatapp.engine.flash_choice import flash_pays
from chatapp.engine.kv_placement import FRESH_TOKENS
from chatapp.engine.kv_types import KvType
from chatapp.engine.llama_native import NativeContext, NativeModel, gpu_offload_supported
from chatapp.engine.remote import RemoteConfig, RemoteEngine
from chatapp.engine.remote_chat import RemoteChatEngine
from chatapp.engine.remote_http import MissingEndpointError, RemoteClient
from chatapp.engine.thread_switches import brisk_thread_switches
from chatapp.prompting.prompt import PromptBuilder

# The composition root's and the bench's; and for measurement (tools/) llama.cpp's contexts bare, the in-process
# engine itself and the batch probe (Engine, NativeContext, NativeModel, ProbeSettings, gpu_offload_supported, probe).
__all__ = [
    "FLASH_ATTENTION_ROWS",
    "FRESH_TOKENS",
    "PROMPTS_TOGETHER",
    "CacheFactory",
    "Engine",
    "EngineConfig",
    "FlashSetting",
    "KvType",
    "LoadProgress",
    "NativeContext",
    "NativeModel",
    "ProbeSettings",
    "RemoteConfig",
    "brisk_thread_switches",
    "connect_remote_engine",
    "default_thread_count",
    "flash_pays",
    "gpu_offload_supported",
    "library_version",
    "open_prompt_builder",
    "probe",
    "prompts_together_ratio",
    "split_progress",
    "start_local_engine",
]


def start_local_engine(config: EngineConfig, cache_factory: CacheFactory | None = None) -> LocalEngine:
    """Load the model in this process; its KV prefixes go to the cache the factory opens."""
    return Engine(config, cache_factory)


def connect_remote_engine(config: RemoteConfig) -> EngineClient:
    """An engine on a server; RemoteEngineError when it cannot be used.

    A server that shares its template and tokenizer (`/props`: llama-server, `chatapp serve`) gets
    token ids, so its prefix cache sees exactly chatapp's prefixes; any other (vLLM, SGLang, Ollama,
    an OpenAI-style API) gets chat messages and builds the prompts itself (`info.description` says so).
    """
    client = RemoteClient(config)
    try:
        props = client.get_json("/props")
    except MissingEndpointError:
        return RemoteChatEngine(client)
    except BaseException:
        client.close()
        raise
    if not props.get("chat_template"):
        return RemoteChatEngine(client)
    return RemoteEngine(client, props)


def open_prompt_builder(model_path: Path) -> PromptBuilder:
    """A prompt builder from the model's vocabulary alone (no weights, no context): for the bench."""
    return PromptBuilder.for_model(NativeModel(model_path, vocab_only=True))


def library_version() -> str:
    """The llama.cpp binding's version: part of every cache key (state bytes change between releases)."""
    return str(llama_cpp.__version__)
