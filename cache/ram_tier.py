"""Tier "ram": block payloads in host memory under a byte budget, LRU with a sliding TTL.

Pinned blocks are never evicted or expired. All methods are thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from cache.keys import BlockKey
from cache.stats import TierCounters


@dataclass
class _Slot:
    payload: bytes
    expires_at: float
    pinned: bool


BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def uptime_clock() -> float:
    """Seconds that keep counting while a laptop sleeps (CLOCK_BOOTTIME), and never go back.

    `time.monotonic` stops during suspend on Linux, so entries would outlive their TTL by
    every night the laptop slept; the wall clock can go back. Elsewhere: monotonic.
    """
    return time.clock_gettime(BOOTTIME) if BOOTTIME is not None else time.monotonic()


class RamTier:
    def __init__(self, budget_bytes: int, ttl_seconds: float, clock: Callable[[], float] = uptime_clock) -> None:
        self.budget_bytes = budget_bytes
        self.ttl_seconds = ttl_seconds
        self.counters = TierCounters()
        self._clock = clock
        self._slots: OrderedDict[BlockKey, _Slot] = OrderedDict()
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

    def get(self, key: BlockKey) -> bytes | None:
        now = self._clock()
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                self.counters.misses += 1
                return None
            if not slot.pinned and slot.expires_at <= now:
                self._drop(key)
                self.counters.expirations += 1
                self.counters.misses += 1
                return None
            slot.expires_at = now + self.ttl_seconds
            self._slots.move_to_end(key)
            self.counters.hits += 1
            self.counters.bytes_read += len(slot.payload)
            return slot.payload

    def put(self, key: BlockKey, payload: bytes, *, pinned: bool = False) -> None:
        """Keep `payload`; evict least recently used unpinned blocks past the budget."""
        if len(payload) > self.budget_bytes and not pinned:
            return
        with self._lock:
            if key in self._slots:
                self._drop(key)
            self._slots[key] = _Slot(payload, self._clock() + self.ttl_seconds, pinned)
            self._bytes += len(payload)
            self.counters.bytes_written += len(payload)
            self._evict_over_budget()

    def set_pinned(self, key: BlockKey, pinned: bool) -> None:
        with self._lock:
            slot = self._slots.get(key)
            if slot is not None:
                slot.pinned = pinned

    def discard(self, key: BlockKey) -> None:
        with self._lock:
            if key in self._slots:
                self._drop(key)

    def prune(self) -> int:
        """Drop expired blocks now; return how many."""
        now = self._clock()
        with self._lock:
            expired = [key for key, slot in self._slots.items() if not slot.pinned and slot.expires_at <= now]
            for key in expired:
                self._drop(key)
            self.counters.expirations += len(expired)
            return len(expired)

    def clear(self) -> None:
        with self._lock:
            self._slots.clear()
            self._bytes = 0

    def _drop(self, key: BlockKey) -> None:
        slot = self._slots.pop(key)
        self._bytes -= len(slot.payload)

    def _evict_over_budget(self) -> None:
        if self._bytes <= self.budget_bytes:
            return
        for key in [key for key, slot in self._slots.items() if not slot.pinned]:
            if self._bytes <= self.budget_bytes:
                break
            self._drop(key)
            self.counters.evictions += 1
