"""Engines with a prefix cache in a test folder."""

from __future__ import annotations

from pathlib import Path

from cache.fingerprint import hash_file
from cache.prefix_cache import CacheConfig
from chatapp.engine.engine import Engine, EngineConfig
from chatapp.engine.kv_types import KvType
from chatapp.services.startup import kv_cache_factory


def cached_engine(
    folder: Path,
    model_path: Path,
    *,
    block_size: int = 16,
    context: int = 1024,
    sequences: int = 2,
    threads: int | None = None,
    n_batch: int = 512,
    swa_full: bool = True,
    flash_attention: bool = False,
    kv_type: KvType = KvType.F16,
    ready_state_bytes: int = EngineConfig.ready_state_bytes,
    ram_bytes: int = 512 << 20,
    disk_bytes: int = 1 << 30,
    fixed_batches: bool | None = None,
    check_every: int = 0,
) -> Engine:
    config = CacheConfig(
        block_size=block_size,
        ram_budget_bytes=ram_bytes,
        disk_budget_bytes=disk_bytes,
        ttl_seconds=3600,
        check_every=check_every,
    )
    engine_config = EngineConfig(
        model_path=model_path,
        context_cap=context,
        sequences=sequences,
        threads=threads,
        n_batch=n_batch,
        swa_full=swa_full,
        flash_attention=flash_attention,
        kv_type=kv_type,
        ready_state_bytes=ready_state_bytes,
        fixed_batches=fixed_batches,
    )
    return Engine(engine_config, kv_cache_factory(folder, hash_file(model_path), config))
