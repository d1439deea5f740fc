"""The namespace: everything that changes KV bytes, hashed into the seed of every key.

Two contexts whose KV bytes could differ for the same tokens must never share entries:
a different model file (by content), KV types, flash attention (it changes the V
layout), LoRA adapters, rope settings, the llama-cpp-python version, or the block size.
The context size is in it too: for most models a prefix's KV does not depend on it, but
when in doubt the cache misses rather than restore something a cold run would not compute.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import xxhash


@dataclass(frozen=True)
class Namespace:
    model_fingerprint: str
    type_k: int
    type_v: int
    flash_attention: bool
    block_size: int
    library_version: str
    rope_freq_base: float = 0.0
    rope_freq_scale: float = 0.0
    lora_adapters: tuple[str, ...] = ()
    layout_digest: str = ""
    context_size: int = 0  # tokens per sequence
    # The fewest tokens in a prompt batch when it is not the default: batches of other shapes
    # round differently (flash attention's batches of 64+ since the rule was made). Left out of
    # the canonical form when 0, so caches written before the field keep their keys.
    batch_rows: int = 0
    # Prompts computed in fixed batches of this many tokens (a model whose KV depends on where
    # batches end); 0 (left out) where batches end anywhere.
    batch_grid: int = 0
    # The cells a sliding-window cache holds per sequence (swa_full, the batch size): where the window's
    # cells lie, and so the bits of every token after its first wrap; 0 (left out) without a window.
    window_cells: int = 0
    # The device offloaded layers run on: its kernels round otherwise than the CPU's; "" (left out) on the CPU.
    device: str = ""

    def canonical(self) -> str:
        fields = asdict(self)
        for optional in ("batch_rows", "batch_grid", "window_cells", "device"):
            if not fields[optional]:
                del fields[optional]
        return json.dumps(fields, sort_keys=True)

    def _canonical_bytes(self) -> bytes:
        return self.canonical().encode("utf-8")

    @property
    def id(self) -> str:
        """32 hex characters naming this namespace (used in stored records)."""
        return xxhash.xxh3_128_hexdigest(self._canonical_bytes())

    @property
    def seed(self) -> int:
        """The 64-bit seed of every block key in this namespace."""
        return xxhash.xxh3_64_intdigest(self._canonical_bytes())
