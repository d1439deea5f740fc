"""Opening what every entry point needs: data folder, settings, and the engine."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cache.fingerprint import file_fingerprint
from chatapp.engine.engine import Engine, EngineConfig
from chatapp.engine.llama_native import SamplingParams
from chatapp.model_files import resolve_model_path
from chatapp.paths import DataPaths, open_data_paths
from chatapp.settings import Settings, load_settings

FINGERPRINT_MEMO = "model-fingerprints.json"


@dataclass(frozen=True)
class Workspace:
    """The data folder and the settings read from it."""

    paths: DataPaths
    settings: Settings

    @property
    def model_path(self) -> Path:
        return resolve_model_path(self.settings.model)

    def sampling(self) -> SamplingParams:
        settings = self.settings
        return SamplingParams(
            temperature=settings.temperature,
            top_p=settings.top_p,
            seed=settings.seed,
            max_tokens=settings.max_tokens,
        )

    def engine_config(self) -> EngineConfig:
        settings = self.settings
        return EngineConfig(
            model_path=self.model_path,
            context_cap=settings.context_cap,
            sequences=settings.sequences,
            n_gpu_layers=settings.n_gpu_layers,
            threads=settings.threads,
            flash_attention=settings.flash_attention,
        )

    def open_engine(self) -> Engine:
        return Engine(self.engine_config())

    def model_fingerprint(self, model_path: Path) -> str:
        """The model's content hash, remembered in the cache folder."""
        memo = self.paths.private_dir(self.paths.cache_dir) / FINGERPRINT_MEMO
        return file_fingerprint(model_path, memo)


def open_workspace(data_dir: str | None, overrides: dict[str, Any] | None = None) -> Workspace:
    """Create the data folder if needed and load settings with command-line overrides."""
    paths = open_data_paths(data_dir)
    return Workspace(paths=paths, settings=load_settings(paths.config_file, overrides))


def quiet_native_logs() -> None:
    """llama.cpp's log goes to Python logging; with no handler set, drop it rather than print it."""
    logging.getLogger("chatapp.llama").addHandler(logging.NullHandler())
