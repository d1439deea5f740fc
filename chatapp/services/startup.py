"""Opening what every entry point needs: data folder, settings, and the engine."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from cache import maintenance
from cache.fingerprint import FingerprintCancelled, files_fingerprint, fingerprints_remembered
from cache.namespace import Namespace
from cache.prefix_cache import STOPPED_NOTICE, CacheConfig, PrefixCache
from cache.state_format import MemoryLayout
from chatapp.engine.contract import EngineClient, ModelInfo, SamplingParams
from chatapp.engine.opening import (
    FLASH_ATTENTION_ROWS,
    CacheFactory,
    EngineConfig,
    FlashSetting,
    KvType,
    LoadProgress,
    RemoteConfig,
    brisk_thread_switches,
    connect_remote_engine,
    library_version,
    split_progress,
    start_local_engine,
)
from chatapp.errors import LoadCancelled
from chatapp.models.catalog import ModelCatalog, split_parts
from chatapp.models.machine import machine_catalog, resolve_model, split_folders
from chatapp.paths import DataPaths, open_data_paths
from chatapp.settings import Settings, load_settings

log = logging.getLogger(__name__)
FINGERPRINT_MEMO = "model-fingerprints.json"
BATCH_VERDICTS = "batch-verdicts.json"  # per model, build, CPU and settings: do answers batch exactly here
HASH_SHARE = 0.5  # of a first load's progress bar: the content hash reads the file once, the load again


# The settings' words for flash attention, as the engine takes them ("auto": flash_choice.py measures).
FLASH_SETTINGS: dict[str, FlashSetting] = {"auto": "auto", "on": True, "off": False}


@dataclass(frozen=True)
class Workspace:
    """The data folder and the settings read from it."""

    paths: DataPaths
    settings: Settings
    overrides: dict[str, Any] = field(default_factory=dict)  # from the command line, for this run only

    def saved_settings(self) -> Settings:
        """The settings file alone, without this run's command-line overrides (what the settings screen edits)."""
        return load_settings(self.paths.config_file)

    def reloaded(self) -> Workspace:
        """The workspace after the settings file changed: the file, then the overrides again."""
        return replace(self, settings=load_settings(self.paths.config_file, self.overrides))

    @property
    def remote(self) -> RemoteConfig | None:
        """The backend server when the settings name one (the model then runs there, not here)."""
        settings = self.settings
        if settings.backend is None:
            return None
        return RemoteConfig(settings.backend, api_key=settings.backend_key, model=settings.backend_model)

    def model_label(self) -> str:
        """What the model is called while it loads: its file, or the server that runs it."""
        remote = self.remote
        return remote.base_url if remote is not None else self.model_path.name

    def model_identity(self, info: ModelInfo) -> tuple[str, str]:
        """Where the model is (file or server) and a fingerprint that tells models apart.

        `info` is the open engine's: a served model is known by what its server says of it.
        """
        if info.server is not None:
            return info.server, f"remote:{info.server}#{info.fingerprint or ''}"
        return str(self.model_path), self.model_fingerprint(self.model_path)

    @cached_property
    def model_path(self) -> Path:
        """The model file, checked once (a failed check is not cached and raises again)."""
        return resolve_model(self.settings.model, self.model_catalog)

    def model_catalog(self) -> ModelCatalog:
        """The models on this machine: the folders in the settings, the bundled one, other tools' downloads."""
        return machine_catalog(split_folders(self.settings.model_folders))

    def sampling(self) -> SamplingParams:
        settings = self.settings
        return SamplingParams(
            temperature=settings.temperature,
            top_p=settings.top_p,
            seed=settings.seed,
            max_tokens=settings.max_tokens,
        )

    def with_model(self, model: Path) -> Workspace:
        """This workspace with another model (for this run: the settings file keeps its own)."""
        return self.with_settings(model=model)

    def with_settings(self, **changes: object) -> Workspace:
        """This workspace with other settings (for this run: the settings file keeps its own)."""
        return replace(self, settings=self.settings.model_copy(update=changes))

    def engine_config(
        self,
        sequences: int | None = None,
        load_progress: Callable[[float], bool] | None = None,
        *,
        serves_many: bool = False,
    ) -> EngineConfig:
        """The engine's settings; `serves_many`: for a server, whose clients' answers may share a decode."""
        settings = self.settings
        return EngineConfig(
            load_progress=load_progress,
            model_path=self.model_path,
            context_cap=settings.context_cap,
            sequences=sequences or settings.sequences,
            n_gpu_layers=settings.n_gpu_layers,
            threads=settings.threads,
            flash_attention=FLASH_SETTINGS[settings.flash_attention],
            serves_many=serves_many,
            kv_type=KvType(settings.kv_type),
            swa_full=settings.swa_full,
            checkpoint_interval=settings.checkpoint_every_blocks * settings.cache_block_size,
            batch_answers=settings.batch_answers,
            fixed_batches={"auto": None, "grid": True, "free": False}[settings.prompt_batches],
            batch_memo=self.paths.private_dir(self.paths.cache_dir) / BATCH_VERDICTS,
        )

    @property
    def kv_cache_dir(self) -> Path:
        return self.paths.private_dir(self.paths.cache_dir) / "kv"

    def open_engine(
        self,
        *,
        use_cache: bool = True,
        sequences: int | None = None,
        load_progress: Callable[[float], bool] | None = None,
        serves_many: bool = False,
    ) -> EngineClient:
        """Load the model; with `use_cache`, its KV prefixes are kept in the cache folder.

        `sequences` overrides the setting: one question needs one sequence, and each one
        reserves a whole context of KV memory. With a backend in the settings, the engine is
        that server (its cache is its own; `use_cache` and `sequences` do not apply).
        `load_progress` hears the share done, the first content hash of a model file included
        (the first half then); False from it stops the hash or the load (LoadCancelled). `serves_many`:
        a server's engine (flash attention's `auto` keeps it off where clients' answers batch).
        """
        remote = self.remote
        if remote is not None:
            return connect_remote_engine(remote)
        with brisk_thread_switches():  # its Python steps never starved by a screen drawing meanwhile
            hashing, loading = self._progress_parts(load_progress, use_cache)
            config = self.engine_config(sequences, loading, serves_many=serves_many)
            return start_local_engine(config, self.cache_factory(hashing) if use_cache else None)

    def _progress_parts(self, progress: LoadProgress | None, use_cache: bool) -> tuple[LoadProgress | None, ...]:
        """The progress of the content hash and of the weights' load: halves when the model is hashed first."""
        if progress is None or not use_cache or fingerprints_remembered(self._model_parts(), self._fingerprint_memo):
            return progress, progress
        return split_progress(progress, HASH_SHARE)

    def cache_config(self) -> CacheConfig:
        settings = self.settings
        return CacheConfig(
            block_size=settings.cache_block_size,
            ram_budget_bytes=settings.cache_ram_mib << 20,
            disk_budget_bytes=settings.cache_disk_mib << 20,
            ttl_seconds=settings.cache_ttl_days * 86400,
            eviction_policy=settings.cache_eviction,
            check_every=settings.cache_checks,
        )

    def cache_factory(self, hash_progress: LoadProgress | None = None) -> CacheFactory:
        """Opens the cache once the engine knows its KV layout (the namespace needs it); the model's
        content hash runs now (`hash_progress` hears its share; False stops it: LoadCancelled)."""
        model_path = self.model_path
        named = self.settings.model
        # A model chosen by name is labelled so (an Ollama blob's file is `sha256-…`).
        shown = str(named) if named is not None and not named.expanduser().exists() else model_path.name
        label = {"model": shown, "path": str(model_path)}
        fingerprint = self.model_fingerprint(model_path, hash_progress)
        return kv_cache_factory(self.kv_cache_dir, fingerprint, self.cache_config(), label)

    def model_fingerprint(self, model_path: Path, progress: LoadProgress | None = None) -> str:
        """The model's content hash (every part of a split model), remembered in the cache folder."""
        try:
            return files_fingerprint(self._model_parts(model_path), self._fingerprint_memo, progress)
        except FingerprintCancelled:
            raise LoadCancelled(f"loading {model_path.name} was cancelled") from None

    def _model_parts(self, model_path: Path | None = None) -> list[Path]:
        path = model_path or self.model_path
        return [part for part in split_parts(path) if part.is_file()] or [path]

    @property
    def _fingerprint_memo(self) -> Path:
        return self.paths.private_dir(self.paths.cache_dir) / FINGERPRINT_MEMO


def kv_cache_factory(
    directory: Path, model_fingerprint: str, config: CacheConfig, label: dict[str, str] | None = None
) -> CacheFactory:
    """A factory the engine calls with the verified KV layout to open the cache in `directory`.

    `label` says whose entries the namespace holds (the model's file name and path), for `cache stats`
    and `cache clear --model` without loading it.
    """

    def open_cache(layout: MemoryLayout, info: ModelInfo) -> PrefixCache:
        type_k, type_v = layout.kv_ggml_types
        namespace = Namespace(
            model_fingerprint=model_fingerprint,
            type_k=type_k,
            type_v=type_v,
            flash_attention=info.flash_attention,
            block_size=config.block_size,
            library_version=library_version(),
            layout_digest=layout.digest().hex(),
            context_size=info.n_ctx_per_sequence,
            batch_rows=FLASH_ATTENTION_ROWS if info.flash_attention else 0,
            batch_grid=info.prompt_grid,
            window_cells=info.window_cells,
            device=info.device if info.gpu_layers > 0 else "",
        )
        try:
            maintenance.remember_namespace(
                directory, namespace.id, {**(label or {}), "fingerprint": model_fingerprint, "kind": layout.kind.value}
            )
        except OSError as error:  # a full or read-only folder: the disk tier says what is wrong
            log.warning("could not note the cache namespace's model: %s", error)
        return PrefixCache(directory, namespace, layout, config)

    return open_cache


def open_workspace(data_dir: str | None, overrides: dict[str, Any] | None = None) -> Workspace:
    """Create the data folder if needed and load settings with command-line overrides."""
    paths = open_data_paths(data_dir)
    overrides = {key: value for key, value in (overrides or {}).items() if value is not None}
    return Workspace(paths=paths, settings=load_settings(paths.config_file, overrides), overrides=overrides)


def quiet_native_logs() -> None:
    """Logs go to Python logging; with no handler set, drop them rather than print over the screen."""
    for name in ("chatapp", "cache"):
        logging.getLogger(name).addHandler(logging.NullHandler())


def make_new_files_private() -> None:
    """Prompts, documents and KV states are private: new files 0600, new folders 0700."""
    os.umask(0o077)


def engine_notices(engine: EngineClient) -> list[str]:
    """What a user should hear once about an engine: how a server is driven, why the cache is off or limited."""
    notices = []
    if engine.info.server is not None and engine.prompt_builder is None:
        notices.append(
            f"the engine at {engine.info.server} builds its own prompts (it shares no tokenizer or template): "
            "chatapp sends it chat messages, and what it reuses is what it reports"
        )
    if engine.cache_problem:
        notices.append(engine.cache_problem)
    if engine.cache is not None and engine.cache.problem:
        notices.append(engine.cache.problem)
    if engine.cache is not None and engine.cache.checks.suspended:
        notices.append(STOPPED_NOTICE)
    return notices
