"""Pinned prefixes: their entries kept past eviction and TTL, in every tier, until unpinned.

A pinned entry lives in the disk's never-culled store and RAM's policy passes over it. Prefixes
share entries, so an unpin leaves pinned what another pin still holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from cache.blocks import BlockInfo
from cache.entries import Entries
from cache.keys import BlockKey, as_token_array


class Pins:
    def __init__(self, entries: Entries, restorable: Callable[[np.ndarray], Sequence[BlockInfo]]) -> None:
        """`restorable`: the entries a restore of a prompt's longest cached prefix reads, in order."""
        self.entries = entries
        self._restorable = restorable

    def pin(self, tokens: Sequence[int], pinned: bool = True, keep: Sequence[Sequence[int]] = ()) -> int:
        """Pin (or unpin) the stored entries of this prefix, its deepest checkpoint among them; how many of its
        entries are now as asked.

        Only entries whose state changes are read and moved, so pinning a prefix that extends a pinned
        one costs its new blocks only. An unpin leaves pinned what the prefixes in `keep` (pins that
        share blocks with this one) still hold.
        """
        chain = self._restorable(as_token_array(tokens))
        kept: set[BlockKey] = set()
        for other in keep if not pinned else ():
            kept.update(info.key for info in self._restorable(as_token_array(other)))
        done = 0
        for info in chain:
            if info.pinned == pinned:
                done += 1
                continue
            if not pinned and (info.key in kept or self._pinned_delta_on(info)):
                continue  # another pin still needs it
            payload, _served = self.entries.payload(info)
            if payload is None:
                if pinned:
                    break  # lost: what follows cannot be restored without it
                continue
            self.entries.tiers.set_pinned(info, payload, pinned)
            done += 1
        return done

    def _pinned_delta_on(self, base: BlockInfo) -> bool:
        """Whether a pinned checkpoint delta extends `base` (a chain unpins its own delta before its base)."""
        with self.entries.lock:
            return any(info.pinned and info.extends == base.key for info in self.entries.index.checkpoints.values())
