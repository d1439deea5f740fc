"""Engines with a prefix cache in a test folder."""

from __future__ import annotations

from pathlib import Path

from cache.fingerprint import hash_file
from cache.prefix_cache import CacheConfig
from chatapp.engine.engine import Engine, EngineConfig
from chatapp.services.startup import kv_cache_factory


def cached_engine(
    folder: Path,
    model_path: Path,
    *,
    block_size: int = 16,
    context: int = 1024,
    sequences: int = 2,
    threads: int | None = None,
) -> Engine:
    config = CacheConfig(block_size=block_size, ram_budget_bytes=512 << 20, disk_budget_bytes=1 << 30, ttl_seconds=3600)
    engine_config = EngineConfig(model_path=model_path, context_cap=context, sequences=sequences, threads=threads)
    return Engine(engine_config, kv_cache_factory(folder, hash_file(model_path), config))
