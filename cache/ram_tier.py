"""Tier "ram": block payloads in host memory under a byte budget, evicted by a policy, with a sliding TTL.

The policy (cache/eviction.py: LRU unless told otherwise) chooses each victim while the tier is
over budget; it learns each block's place in the prefix tree from `put`. Pinned blocks are
never evicted or expired. All methods are thread-safe: the tier's lock guards its policy too.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np

from cache.blocks import BlockInfo, PayloadParts
from cache.eviction import BlockPlace, EvictionPolicy, LruPolicy
from cache.keys import BlockKey
from cache.state_assembly import in_parallel
from cache.stats import RamStats, TierCounters
from cache.tier import Keep, Sink, Stored
from cache.tiers import ReuseTier

# A block's bytes: as stored (bytes), or the read-only memory a restore read it into from disk (no copy made).
RamPayload = bytes | np.ndarray


@dataclass
class _Slot:
    payload: RamPayload
    expires_at: float
    pinned: bool
    checksum: int | None  # the record's, where the caller gave it


BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def uptime_clock() -> float:
    """Seconds that keep counting while a laptop sleeps (CLOCK_BOOTTIME), and never go back.

    `time.monotonic` stops during suspend on Linux, so entries would outlive their TTL by
    every night the laptop slept; the wall clock can go back. Elsewhere: monotonic.
    """
    return time.clock_gettime(BOOTTIME) if BOOTTIME is not None else time.monotonic()


def place_of(info: BlockInfo) -> BlockPlace:
    """An entry's place in the prefix tree, for the policy; a checkpoint hangs off its anchor and costs the tokens
    from the anchor to its position."""
    return BlockPlace(info.parent, info.start, int(info.tokens.size))


class RamTier:
    """The cache's entries in memory (a `Tier`), and by key the whole states kept ready (`keep`, `get`, `drop`)."""

    name = ReuseTier.RAM
    checks_payloads = True  # its own memory, kept under the record's checksum
    enabled = True

    def __init__(
        self,
        budget_bytes: int,
        ttl_seconds: float,
        clock: Callable[[], float] = uptime_clock,
        policy: EvictionPolicy | None = None,
    ) -> None:
        self.budget_bytes = budget_bytes
        self.ttl_seconds = ttl_seconds
        self.counters = TierCounters()
        self.policy: EvictionPolicy = policy if policy is not None else LruPolicy()
        self._clock = clock
        self._slots: dict[BlockKey, _Slot] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def bytes_used(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, key: BlockKey) -> bool:
        with self._lock:
            return key in self._slots

    def get(self, key: BlockKey, checksum: int | None = None) -> RamPayload | None:
        """The payload, unless expired, or kept under another `checksum` than the caller's record says (a
        block stored again with other bytes since the caller looked it up: a miss, never those bytes)."""
        now = self._clock()
        with self._lock:
            slot = self._slots.get(key)
            if slot is None or (checksum is not None and slot.checksum not in (None, checksum)):
                self.counters.misses += 1
                return None
            if not slot.pinned and slot.expires_at <= now:
                self._remove(key)
                self.counters.expirations += 1
                self.counters.misses += 1
                return None
            slot.expires_at = now + self.ttl_seconds
            self.policy.touch(key, now)
            self.counters.hits += 1
            self.counters.bytes_read += len(slot.payload)
            return slot.payload

    def holding(self, infos: Sequence[BlockInfo]) -> set[BlockKey]:
        return {info.key for info in infos if info.key in self}

    def read_into(self, infos: Sequence[BlockInfo], sink: Sink, *, keep: Keep) -> list[bool]:
        """Each kept payload to `sink` (its own memory: nothing copied), on several threads when large, as the
        disk's readers do. Taken deepest first, so that the first, which the others need, is used last: the
        policy keeps it longest."""
        found = {}
        for number in reversed(range(len(infos))):
            payload = self.get(infos[number].key, infos[number].checksum)
            if payload is not None:
                found[number] = payload
        pieces = sorted(found.items())

        def hand(chosen: slice) -> None:
            for number, payload in pieces[chosen]:
                sink(number, payload)

        in_parallel(hand, len(pieces), sum(len(payload) for _, payload in pieces))
        return [number in found for number in range(len(infos))]

    def put(self, info: BlockInfo, payload: Stored) -> bool:
        size = payload.nbytes if isinstance(payload, PayloadParts) else len(payload)
        if size > self.budget_bytes and not info.pinned:
            return False
        kept = payload.joined() if isinstance(payload, PayloadParts) else payload
        self.keep(info.key, kept, pinned=info.pinned, place=place_of(info), checksum=info.checksum)
        return True

    def would_keep(self, prefix: Sequence[BlockInfo]) -> list[bool]:
        """Which of a prefix's entries, given in order, this tier would keep if handed them all: the first ones
        (the policy keeps a prefix's first blocks longest), within the budget. A fetch reads only those into
        memory for it; the rest go through the readers' scratch, so a prefix larger than the budget never
        holds every block beside its state, only to see most of them evicted at once."""
        room = self.budget_bytes
        keep = []
        for info in prefix:
            room -= info.payload_size
            keep.append(room >= 0 or info.pinned)
        return keep

    def storing(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def touch(self, infos: Sequence[BlockInfo]) -> None:
        """Make kept entries the most recently used (the last most) and renew their TTL, as `get` does, without
        counting a hit."""
        now = self._clock()
        with self._lock:
            for info in infos:
                slot = self._slots.get(info.key)
                if slot is None or (not slot.pinned and slot.expires_at <= now):
                    continue
                slot.expires_at = now + self.ttl_seconds
                self.policy.touch(info.key, now)

    def discard(self, info: BlockInfo) -> None:
        self.drop(info.key)

    def set_pinned(self, info: BlockInfo, payload: bytes, pinned: bool) -> None:
        with self._lock:
            slot = self._slots.get(info.key)
            if slot is not None:
                slot.pinned = pinned
                self.policy.set_pinned(info.key, pinned)

    def new_entries(self) -> list[BlockInfo]:
        return []  # this process's memory: the index already knows all it holds

    def stats(self) -> RamStats:
        return {
            "eviction_policy": self.policy.name,
            "entries": len(self),
            "bytes": self.bytes_used,
            "budget_bytes": self.budget_bytes,
            **self.counters.as_dict(),
        }

    def close(self) -> None:
        pass  # memory: it goes with the process

    def keep(
        self,
        key: BlockKey,
        payload: RamPayload,
        *,
        pinned: bool = False,
        place: BlockPlace | None = None,
        checksum: int | None = None,
    ) -> None:
        """Keep `payload`; evict the policy's victims past the budget.

        `place` (the block's parent, start and tokens) lets a policy weigh the block; without
        it the block counts as a first block of `len(payload)` tokens.
        """
        if len(payload) > self.budget_bytes and not pinned:
            return
        now = self._clock()
        with self._lock:
            old = self._slots.get(key)
            if old is not None:
                self._bytes -= len(old.payload)
            self._slots[key] = _Slot(payload, now + self.ttl_seconds, pinned, checksum)
            self._bytes += len(payload)
            self.counters.bytes_written += len(payload)
            self.policy.admit(key, place or BlockPlace(None, 0, len(payload)), len(payload), now, pinned)
            self._evict_over_budget()

    def drop(self, key: BlockKey) -> None:
        with self._lock:
            if key in self._slots:
                self._remove(key)

    def prune(self) -> int:
        """Drop expired blocks now; return how many."""
        now = self._clock()
        with self._lock:
            expired = [key for key, slot in self._slots.items() if not slot.pinned and slot.expires_at <= now]
            for key in expired:
                self._remove(key)
            self.counters.expirations += len(expired)
            return len(expired)

    def clear(self) -> int:
        with self._lock:
            count = len(self._slots)
            self._slots.clear()
            self.policy.clear()
            self._bytes = 0
            return count

    def _remove(self, key: BlockKey) -> None:
        slot = self._slots.pop(key)
        self._bytes -= len(slot.payload)
        self.policy.forget(key)

    def _evict_over_budget(self) -> None:
        while self._bytes > self.budget_bytes:
            key = self.policy.victim()
            if key is None:
                break  # the rest is pinned (or, for a tree-aware policy, held by pinned children)
            self._remove(key)
            self.counters.evictions += 1
