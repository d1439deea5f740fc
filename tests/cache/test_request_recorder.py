"""The request recorder: counts by tier, and the marks a prompt could end at, short blocks the cache
evicted included (synthetic blocks, no model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cache.blocks import BlockInfo
from cache.index import BlockIndex
from cache.request_recorder import RequestRecorder
from cache.tiers import ReuseTier
from tests.cache.test_prefix_cache import LAYOUT

BLOCK = 4
SEED = 7


def recorder(folder: Path) -> RequestRecorder:
    return RequestRecorder(folder, LAYOUT, BLOCK, SEED, 1 << 20, enabled=True)


def short_block_after(index: BlockIndex, tokens: np.ndarray, short: np.ndarray) -> BlockInfo:
    """A stored short block that follows `tokens`' whole blocks (its key as the index makes it)."""
    (key, parent, start, _end), *_ = index.keys_for(np.concatenate([tokens, short]))[len(tokens) // BLOCK :]
    return BlockInfo(key, parent, start, short, 10, 0)


def test_counts_add_up_by_tier(tmp_path: Path) -> None:
    counting = recorder(tmp_path)
    counting.count(100, 60, ReuseTier.DISK)
    counting.count(50, 0, ReuseTier.NONE)
    assert (counting.counters.requests, counting.counters.prompt_tokens, counting.counters.reused_tokens) == (
        2,
        150,
        60,
    )
    assert counting.counters.reused_by_tier[ReuseTier.DISK] == 60


def test_a_short_block_the_cache_evicted_is_still_a_mark_until_forgotten(tmp_path: Path) -> None:
    counting = recorder(tmp_path)
    index = BlockIndex(BLOCK, SEED)
    whole = np.arange(8, dtype=np.int32)
    for key, parent, start, end in index.keys_for(whole):
        index.add(BlockInfo(key, parent, start, whole[start:end], 10, 0))
    short = short_block_after(index, whole, np.array([50, 51], dtype=np.int32))
    counting.remember(short)  # stored, then evicted: the index never held it
    prompt = np.concatenate([whole, np.array([50, 51, 52, 53, 54], dtype=np.int32)])
    marks = counting.partial_matches(index, prompt, index.keys_for(prompt))
    assert [(mark.key, mark.end) for mark in marks] == [(short.key, 10)]
    counting.forget(short.key)
    assert counting.partial_matches(index, prompt, index.keys_for(prompt)) == []
