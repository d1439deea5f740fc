"""What the cache was asked for, counted for its figures and logged with what each store added for
`chatapp cache advise` (cache/request_log.py holds the records, cache/sizing.py the advice).

Its own object beside the tiers: the cache tells it of each request and each store. It keeps the short
blocks ever stored (a sequence's last, partial block), so that a later prompt extending one the cache has
evicted is logged as able to reuse it; sizing advice then decides at each budget whether it would still be
kept. Not locked on its own: the cache calls it under its lock, except `log_request` and `log_stored`,
which only append.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from cache.blocks import BlockInfo
from cache.index import BlockIndex
from cache.keys import BlockKey
from cache.request_log import LoggedRequest, LoggedStore, RequestLog, encode_request, encode_store, short_key
from cache.state_format import MemoryLayout
from cache.stats import RequestCounters
from cache.tiers import ReuseTier

REMEMBERED_SHORT_BLOCKS = 65_536  # forgotten all at once past this
BlockKeys = list[tuple[BlockKey, BlockKey, int, int]]  # a prompt's blocks: key, parent, start, end


class RequestRecorder:
    def __init__(
        self, directory: Path, layout: MemoryLayout, block_size: int, seed: int, log_bytes: int, *, enabled: bool
    ) -> None:
        self.counters = RequestCounters()
        self.log = RequestLog(directory, log_bytes, enabled=enabled)
        self._layout = layout
        self._block_size = block_size
        self._seed = seed
        self._short_blocks = BlockIndex(block_size, seed)

    def count(self, prompt_tokens: int, reused_tokens: int, tier: ReuseTier) -> None:
        self.counters.requests += 1
        self.counters.prompt_tokens += prompt_tokens
        self.counters.reused_tokens += reused_tokens
        if tier in self.counters.reused_by_tier:
            self.counters.reused_by_tier[tier] += reused_tokens

    def remember(self, info: BlockInfo) -> None:
        """A block stored (here or by another process): kept if short."""
        if info.checkpoint or info.tokens.size >= self._block_size:
            return
        if len(self._short_blocks) >= REMEMBERED_SHORT_BLOCKS:
            self._short_blocks = BlockIndex(self._block_size, self._seed)
        self._short_blocks.add(info)

    def forget(self, key: BlockKey) -> None:
        """A block forgotten for good (what a deleted conversation held): not logged as reusable again."""
        self._short_blocks.remove(key)

    def reset(self) -> None:
        self._short_blocks = BlockIndex(self._block_size, self._seed)

    def partial_matches(self, index: BlockIndex, prompt: np.ndarray, keys: BlockKeys) -> list[BlockInfo]:
        """Stored blocks a restore of `prompt` could end in that are not its own (`keys`, its blocks): one
        `index` holds under a parent the prompt reaches (shorter, or matched in part), and short blocks
        remembered after eviction. Marks ending where each match does."""
        marks: dict[BlockKey, BlockInfo] = {}
        reachable = True  # the index holds nothing past the prompt's first block it lacks
        for key, parent, start, end in keys:
            for known in (index, self._short_blocks) if reachable else (self._short_blocks,):
                found, shared = known.closest_child(parent, prompt[start:end])
                if found is not None and found.key != key and found.key not in marks:
                    marks[found.key] = replace(found, tokens=found.tokens[:shared], order_key=b"")
            reachable = reachable and key in index
        return sorted(marks.values(), key=lambda info: info.end)

    def log_request(
        self,
        prompt: np.ndarray,
        keys: BlockKeys,
        marks: list[BlockInfo],
        reused_tokens: int,
        tier: ReuseTier,
        *,
        in_place: int,
        limit: int | None,
        prefill_ms: float,
        started: float | None,
    ) -> None:
        """Log a request for sizing advice: its blocks (`keys`) and where else a restore could end (`marks`)."""
        memory = self._layout.memory
        request = LoggedRequest(
            time.time() if started is None else started,
            self.log.session,
            int(prompt.size),
            int(prompt.size) if limit is None else limit,
            in_place,
            reused_tokens,
            tier,
            memory.restores_at_checkpoints,
            self._block_size,
            prefill_ms,
            np.array([short_key(key) for key, _, _, _ in keys], dtype=np.uint64),
            np.array([short_key(info.key) for info in marks], dtype=np.uint64),
            np.array([info.end for info in marks], dtype=np.uint32),
            not memory.has_blocks,
        )
        self.log.append(encode_request(request))

    def log_stored(self, stored: list[BlockInfo]) -> None:
        """Note what a store added, for sizing advice."""
        if not stored or not self.log.enabled:
            return
        record = LoggedStore(
            time.time(),
            self.log.session,
            np.array([short_key(info.key) for info in stored], dtype=np.uint64),
            np.array([short_key(info.parent) for info in stored], dtype=np.uint64),
            np.array([info.start for info in stored], dtype=np.uint32),
            np.array([info.tokens.size for info in stored], dtype=np.uint32),
            np.array([info.payload_size for info in stored], dtype=np.uint64),
            np.array([info.checkpoint for info in stored], dtype=bool),
        )
        self.log.append(encode_store(record))
