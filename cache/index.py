"""The in-memory radix index over stored blocks.

Full blocks are found by hash probes along the prompt (one per block). At the first
miss, the parent's children (full or partial blocks that continue the same prefix) are
kept sorted by their tokens, so the child sharing the longest run of tokens with the
prompt is found by binary search: it is the neighbour of the prompt's insertion point.
That gives token-exact reuse without scanning entries.

Checkpoints (the SWA window or recurrent state at one position) hang off their anchor, the
last block boundary at or before their position: a lookup walks the prompt's block keys and
looks at the few checkpoints anchored at each.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cache.blocks import BlockInfo, sort_bytes
from cache.keys import ROOT_KEY, BlockKey, block_key

_TOKEN_BYTES = 4
_CHECKPOINT_SALT = 0x636B7074  # "ckpt": checkpoint keys never equal block keys


@dataclass(frozen=True)
class PrefixMatch:
    """The blocks to restore (in order from position 0) and how many tokens of them match."""

    blocks: tuple[BlockInfo, ...]
    matched_tokens: int

    @property
    def stored_tokens(self) -> int:
        return self.blocks[-1].end if self.blocks else 0


class BlockIndex:
    """Blocks by key, and each parent's children sorted by tokens."""

    def __init__(self, block_size: int, seed: int) -> None:
        self.block_size = block_size
        self.seed = seed
        self.entries: dict[BlockKey, BlockInfo] = {}  # blocks
        self.checkpoints: dict[BlockKey, BlockInfo] = {}
        self._children: dict[BlockKey, list[tuple[bytes, BlockKey]]] = {}
        self._anchored: dict[BlockKey, list[BlockKey]] = {}

    def __len__(self) -> int:
        return len(self.entries) + len(self.checkpoints)

    def clear(self) -> None:
        """Forget every entry (the object stays: the cache's parts share it)."""
        self.entries.clear()
        self.checkpoints.clear()
        self._children.clear()
        self._anchored.clear()

    def __contains__(self, key: object) -> bool:
        return key in self.entries or key in self.checkpoints

    def everything(self) -> list[BlockInfo]:
        """Every block and checkpoint."""
        return [*self.entries.values(), *self.checkpoints.values()]

    def get(self, key: BlockKey) -> BlockInfo | None:
        """The record of a block or checkpoint, if indexed."""
        return self.entries.get(key) or self.checkpoints.get(key)

    def add(self, info: BlockInfo) -> None:
        if info.key in self:
            return
        if info.checkpoint:
            self.checkpoints[info.key] = info
            self._anchored.setdefault(info.parent, []).append(info.key)
            return
        self.entries[info.key] = info
        bisect.insort(self._children.setdefault(info.parent, []), (info.order_key, info.key))

    def remove(self, key: BlockKey) -> BlockInfo | None:
        checkpoint = self.checkpoints.pop(key, None)
        if checkpoint is not None:
            anchored = self._anchored.get(checkpoint.parent, [])
            anchored.remove(key)
            if not anchored:
                self._anchored.pop(checkpoint.parent, None)
            return checkpoint
        info = self.entries.pop(key, None)
        if info is None:
            return None
        siblings = self._children.get(info.parent, [])
        position = bisect.bisect_left(siblings, (info.order_key, info.key))
        if position < len(siblings) and siblings[position][1] == key:
            siblings.pop(position)
        if not siblings:
            self._children.pop(info.parent, None)
        return info

    def children(self, parent: BlockKey) -> list[BlockInfo]:
        return [self.entries[key] for _, key in self._children.get(parent, [])]

    def keys_for(self, tokens: np.ndarray) -> list[tuple[BlockKey, BlockKey, int, int]]:
        """(key, parent, start, end) of every block of `tokens`, the last one possibly partial."""
        result = []
        parent = ROOT_KEY
        for start in range(0, int(tokens.size), self.block_size):
            end = min(start + self.block_size, int(tokens.size))
            key = block_key(parent, tokens[start:end], self.seed)
            result.append((key, parent, start, end))
            parent = key
        return result

    def checkpoint_key(self, tokens: np.ndarray) -> tuple[BlockKey, BlockKey, int]:
        """(key, anchor, anchor position) of a checkpoint after `tokens`."""
        anchor_position = int(tokens.size) - int(tokens.size) % self.block_size
        anchor = ROOT_KEY
        for start in range(0, anchor_position, self.block_size):
            anchor = block_key(anchor, tokens[start : start + self.block_size], self.seed)
        key = block_key(anchor, tokens[anchor_position:], self.seed ^ _CHECKPOINT_SALT)
        return key, anchor, anchor_position

    def deepest_checkpoint(self, prompt: np.ndarray, limit: int) -> BlockInfo | None:
        """The checkpoint at the largest position <= `limit` whose tokens are a prefix of `prompt`."""
        found = self.checkpoints_along(prompt, limit)
        return max(found, key=lambda info: info.end) if found else None

    def checkpoints_along(self, prompt: np.ndarray, limit: int) -> list[BlockInfo]:
        """Every checkpoint at a position <= `limit` whose tokens are a prefix of `prompt`, shallowest first."""
        return self._along(prompt, min(limit, int(prompt.size)), self._checkpoints_at)

    def _checkpoints_at(self, anchor: BlockKey) -> list[BlockInfo]:
        return [self.checkpoints[key] for key in self._anchored.get(anchor, ())]

    def entries_along(self, prompt: np.ndarray) -> list[BlockInfo]:
        """Every block and checkpoint whose tokens lie along `prompt`: the blocks of its chain, the shorter ones
        earlier prompts ended in, and its checkpoints; whatever requests that began as `prompt` may have stored.
        The walk goes on past a missing block: the blocks after it are keyed by the tokens, not by the block."""
        size = int(prompt.size)
        return [*self._along(prompt, size, self.children), *self.checkpoints_along(prompt, size)]

    def _along(self, prompt: np.ndarray, limit: int, hung: Callable[[BlockKey], list[BlockInfo]]) -> list[BlockInfo]:
        """The entries `hung` from each block boundary of `prompt` (by the chain's keys) whose tokens are the
        prompt's from there, ending by `limit`."""
        found: list[BlockInfo] = []
        parent, position = ROOT_KEY, 0
        while position <= limit:
            for info in hung(parent):
                end = position + int(info.tokens.size)
                if end <= limit and np.array_equal(prompt[position:end], info.tokens):
                    found.append(info)
            if position + self.block_size > limit:
                break
            parent = block_key(parent, prompt[position : position + self.block_size], self.seed)
            position += self.block_size
        return found

    def longest_prefix(self, prompt: np.ndarray) -> PrefixMatch:
        """The stored blocks that cover the longest prefix of `prompt`, token-exact."""
        chain: list[BlockInfo] = []
        parent = ROOT_KEY
        position = 0
        size = self.block_size
        while position + size <= prompt.size:
            info = self.entries.get(block_key(parent, prompt[position : position + size], self.seed))
            if info is None:
                break
            chain.append(info)
            parent = info.key
            position += size
        best, best_length = self.closest_child(parent, prompt[position : position + size])
        if best is not None:
            chain.append(best)
            position += best_length
        return PrefixMatch(tuple(chain), position)

    def closest_child(self, parent: BlockKey, wanted: np.ndarray) -> tuple[BlockInfo | None, int]:
        """The child of `parent` sharing the longest run of first tokens with `wanted`, and that length."""
        siblings = self._children.get(parent)
        if not siblings or wanted.size == 0:
            return None, 0
        probe = sort_bytes(wanted)
        position = bisect.bisect_left(siblings, (probe, b""))
        best: BlockInfo | None = None
        best_length = 0
        for neighbour in (position - 1, position):
            if 0 <= neighbour < len(siblings):
                order_key, key = siblings[neighbour]
                length = _common_bytes(order_key, probe) // _TOKEN_BYTES
                if length > best_length:
                    best, best_length = self.entries[key], length
        return best, best_length


def _common_bytes(left: bytes, right: bytes) -> int:
    limit = min(len(left), len(right))
    if left[:limit] == right[:limit]:
        return limit
    low, high = 0, limit  # the answer is in [low, high)
    while high - low > 1:
        middle = (low + high) // 2
        if left[:middle] == right[:middle]:
            low = middle
        else:
            high = middle
    return low
