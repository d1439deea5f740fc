"""How a local engine is set up: the model to load, its context's shape, and where its cache comes from.

Its own module so the composition root (opening.py) and the engine's parts read one
definition without importing the engine thread.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cache.prefix_cache import PrefixCache
from cache.state_format import MemoryLayout
from chatapp.engine.batching import FLASH_ATTENTION_ROWS, MIN_BATCH
from chatapp.engine.kv_types import KvType
from chatapp.engine.model_card import ModelInfo


def default_thread_count() -> int:
    """One thread per core: llama.cpp runs slower on hyper-threads than on cores."""
    logical = os.cpu_count() or 1
    return logical if logical <= 4 else max(4, logical // 2)


LoadProgress = Callable[[float], bool]  # hears the share done (0..1); False stops (LoadCancelled)
FlashSetting = bool | Literal["auto"]  # flash attention on, off, or as measured (flash_choice.py)


def split_progress(progress: LoadProgress | None, at: float) -> tuple[LoadProgress | None, LoadProgress | None]:
    """Two parts of one progress bar: the first's share done maps into [0, at], the second's into [at, 1]."""
    if progress is None:
        return None, None
    told = progress
    return (lambda share: told(share * at)), (lambda share: told(at + share * (1.0 - at)))


@dataclass(frozen=True)
class EngineConfig:
    """How to load the model and shape its context."""

    model_path: Path
    context_cap: int = 8192
    sequences: int = 4
    n_gpu_layers: int = -1  # -1: all layers when the build can offload, else none
    threads: int | None = None
    # On, every prompt batch has at least FLASH_ATTENTION_ROWS tokens (batching.py), which keeps
    # restores exact; each answer then computes 64 prompt tokens, not 2. "auto": flash_choice.py decides.
    flash_attention: FlashSetting = False
    # A server: several clients' answers may share a decode, so `auto` keeps flash attention off.
    serves_many: bool = False
    # The KV cells' number format (kv_types.py): a quantized one turns flash attention on.
    kv_type: KvType = KvType.F16
    n_batch: int = 512
    # Sliding-window models: a full-size window cache keeps every cell (cuts anywhere); off, about
    # one window per sequence (less memory; a cut behind the window rewinds to a checkpoint).
    swa_full: bool = True
    # Models with uncuttable state (sliding window, recurrent): a checkpoint every this many
    # prompt tokens, besides the prompt's end and the boundaries a request names.
    checkpoint_interval: int = 1024
    # Plain KV caches: the newest whole sequence states kept ready to load (cache/ready_states.py).
    ready_state_bytes: int = 256 << 20
    # Answers of several requests in one llama_decode where the model is confirmed batch-invariant
    # (batch_rule.py); the probe's verdicts are remembered in `batch_memo` (None: probed each load).
    batch_answers: bool = True
    batch_memo: Path | None = None
    # Prompts on a fixed grid of batches (batching.GRID_TOKENS), for models whose KV depends on where
    # batches end (split_rule.py): None probes the model (remembered in `batch_memo`), True always,
    # False never (a restore may then part from a cold run at a near tie on such a model).
    fixed_batches: bool | None = None
    # Hears the share of the weights loaded (0..1) while the model loads; False stops the load.
    load_progress: LoadProgress | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.n_batch < MIN_BATCH:
            # batch_end never leaves one token alone, which needs room for three in a batch.
            raise ValueError(f"n_batch must be at least {MIN_BATCH}, got {self.n_batch}")
        if (self.uses_flash_attention or self.flash_attention == "auto") and self.n_batch < 2 * FLASH_ATTENTION_ROWS:
            # Every batch has FLASH_ATTENTION_ROWS tokens or more, and none leaves fewer behind.
            raise ValueError(
                f"with flash attention n_batch must be at least {2 * FLASH_ATTENTION_ROWS}, got {self.n_batch}"
            )

    @property
    def uses_flash_attention(self) -> bool:
        """Asked for, or needed by a quantized KV type (llama.cpp quantizes V only under it)."""
        return self.flash_attention is True or self.kv_type.quantized


# Opens the prefix cache once the state format is verified (the layout) and the model is known.
CacheFactory = Callable[[MemoryLayout, ModelInfo], PrefixCache]
