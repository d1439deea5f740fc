"""What every tier of the cache offers: one interface for RAM, disk and whatever comes next.

A tier keeps the cache's entries (blocks and checkpoints), each under its record (`BlockInfo`:
key, checksum, size, pinned or not). The chain (`cache/tier_chain.py`) walks the tiers fastest
first, and the cache's parts reach entries only through it (PrefixCache names RAM and disk for their
figures and the disk's folder). A new tier (a shared store for several machines, say) is one class
with these members, given to `PrefixCache(..., more_tiers=...)`.

Every call is thread-safe. A tier is a convenience, never a reason to fail: one that cannot do
what is asked says so by its answer (False, a missing entry), not by raising; the chain still
treats an exception from a tier as a miss (or as nothing done).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

import numpy as np

from cache.blocks import BlockInfo, PayloadParts
from cache.keys import BlockKey
from cache.tiers import ReuseTier

Payload = bytes | memoryview | np.ndarray
# Takes an entry's payload as it is read: the entry's index among those asked for, and the bytes (valid only
# during the call unless the read was asked to `keep` them).
Sink = Callable[[int, Payload], None]
# Whether the sink may keep the payloads read: one answer for all, or one per entry asked for.
Keep = bool | Sequence[bool]


def keeps(keep: Keep, index: int) -> bool:
    """Whether the sink may keep entry `index`'s payload."""
    return keep if isinstance(keep, bool) else keep[index]


# An entry's bytes as handed to `put`: whole, memory a read made (kept as it is), or the parts of a state.
Stored = bytes | np.ndarray | PayloadParts


class Tier(Protocol):
    """A memory kind that keeps entries by their records."""

    name: ReuseTier  # where reuse of what it served is counted
    checks_payloads: bool  # False: the chain checks each payload against its record's checksum and size
    enabled: bool  # False: it keeps nothing (a disk switched off for the session)

    def holding(self, infos: Sequence[BlockInfo]) -> set[BlockKey]:
        """Which of these entries it keeps, unexpired (one query for all)."""
        ...

    def read_into(self, infos: Sequence[BlockInfo], sink: Sink, *, keep: Keep) -> list[bool]:
        """Hand each payload it keeps, intact, to `sink`, marked used; which ones it had. Where `keep` says so
        the payloads are memory the sink may keep, else they may be scratch valid during the call only."""
        ...

    def put(self, info: BlockInfo, payload: Stored) -> bool:
        """Keep an entry (replacing one under the same key); False when it could not."""
        ...

    def storing(self) -> AbstractContextManager[None]:
        """Around the puts of one store: a tier may lay them out together (the disk's segments)."""
        ...

    def touch(self, infos: Sequence[BlockInfo]) -> None:
        """Mark entries used (LRU) and renew their TTL, counting no hit: a faster tier served them."""
        ...

    def discard(self, info: BlockInfo) -> None:
        """Drop an entry now, if kept."""
        ...

    def set_pinned(self, info: BlockInfo, payload: bytes, pinned: bool) -> None:
        """Keep an entry past eviction and TTL (or no longer); `payload` for a tier that moves it."""
        ...

    def new_entries(self) -> list[BlockInfo]:
        """Entries other processes (or this one's writer) stored since the last call: the index learns them."""
        ...

    def prune(self) -> int:
        """Drop expired entries now; how many."""
        ...

    def clear(self) -> int:
        """Drop every entry (pinned ones too); how many."""
        ...

    def stats(self) -> Mapping[str, object]:
        """Its sizes, budget and counters, for `cache stats`."""
        ...

    def close(self) -> None: ...
