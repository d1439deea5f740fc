"""Block keys: a chained xxh3-128 over token blocks, seeded by the namespace.

A block's key hashes its parent's key and its own token ids, so it names the whole
prefix up to the block's end: equal keys mean equal prefixes, and a block is only
found after its exact predecessors. A partial block (fewer tokens than the block
size) hashes the same way; its shorter token list gives it a different key.
"""

from __future__ import annotations

from typing import NewType

import numpy as np
import xxhash

# 16 bytes naming a block and, through its chain of parents, every token before its end.
BlockKey = NewType("BlockKey", bytes)

ROOT_KEY = BlockKey(bytes(16))
TOKEN_DTYPE = np.dtype("<i4")


def block_key(parent: BlockKey, tokens: np.ndarray, seed: int) -> BlockKey:
    """The key of the block holding `tokens` after the block `parent` (ROOT_KEY for the first)."""
    digest = xxhash.xxh3_128(parent, seed=seed)
    digest.update(np.ascontiguousarray(tokens, dtype=TOKEN_DTYPE).data)
    return BlockKey(digest.digest())


def as_token_array(tokens: object) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(tokens, dtype=TOKEN_DTYPE))


def common_prefix_length(left: np.ndarray, right: np.ndarray) -> int:
    """How many leading tokens two arrays share (numpy-fast)."""
    limit = min(left.size, right.size)
    if limit == 0:
        return 0
    differ = np.flatnonzero(left[:limit] != right[:limit])
    return int(differ[0]) if differ.size else limit
