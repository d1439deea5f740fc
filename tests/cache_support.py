"""Engines with a prefix cache in a test folder."""

from __future__ import annotations

from pathlib import Path

import llama_cpp

from cache.fingerprint import hash_file
from cache.namespace import Namespace
from cache.prefix_cache import CacheConfig, PrefixCache
from cache.state_format import KVLayout
from chatapp.engine.engine import CacheFactory, Engine, EngineConfig, ModelInfo


def cache_factory(folder: Path, model_path: Path, config: CacheConfig) -> CacheFactory:
    fingerprint = hash_file(model_path)

    def open_cache(layout: KVLayout, info: ModelInfo) -> PrefixCache:
        first = layout.layers[0]
        namespace = Namespace(
            fingerprint, first.k_type, first.v_type, info.flash_attention, config.block_size,
            llama_cpp.__version__, layout_digest=layout.digest().hex(),
        )
        return PrefixCache(folder, namespace, layout, config)

    return open_cache


def cached_engine(
    folder: Path, model_path: Path, *, block_size: int = 16, context: int = 1024, sequences: int = 2, threads: int | None = None
) -> Engine:
    config = CacheConfig(block_size=block_size, ram_budget_bytes=512 << 20, disk_budget_bytes=1 << 30, ttl_seconds=3600)
    engine_config = EngineConfig(model_path=model_path, context_cap=context, sequences=sequences, threads=threads)
    return Engine(engine_config, cache_factory(folder, model_path, config))
