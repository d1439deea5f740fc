"""Counters per tier, the cache-wide hit rate, and the typed figures `PrefixCache.stats()` returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TypedDict, cast

from cache.tiers import REUSING_TIERS


class TierCounts(TypedDict):
    hits: int
    misses: int
    evictions: int
    expirations: int
    bytes_written: int
    bytes_read: int


@dataclass
class TierCounters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    expirations: int = 0
    bytes_written: int = 0
    bytes_read: int = 0

    def as_dict(self) -> TierCounts:
        return cast(TierCounts, asdict(self))  # the same fields, by construction


class DiskSizes(TypedDict):
    entries: int
    bytes: int
    pinned_entries: int


class RamStats(TierCounts):
    eviction_policy: str
    entries: int
    bytes: int
    budget_bytes: int


class DiskStats(TierCounts, DiskSizes):
    enabled: bool
    problem: str | None
    budget_bytes: int
    ttl_seconds: float


class MemoryStats(TypedDict):
    """How the model's state is cached: its memory kind, window and checkpoints."""

    kind: str
    window: int
    checkpoints: int
    checkpoint_bytes: int


class CheckStats(TypedDict):
    """Restores checked against cold runs (restore_checks.py): lifetime counts for this namespace."""

    checked: int
    equal: int
    mismatched: int
    pending: int
    suspended: bool


class CacheStats(TypedDict):
    """A snapshot of the whole cache, for the cache screen and `chatapp cache stats`."""

    namespace: str
    block_size: int
    index_entries: int
    pinned_entries: int
    requests: int
    prompt_tokens: int
    reused_tokens: int
    hit_rate: float
    reused_by_tier: dict[str, int]
    ram: RamStats
    disk: DiskStats
    more_tiers: list[dict[str, object]]  # those given as `PrefixCache(..., more_tiers=)`, each its own figures
    memory: MemoryStats
    checks: CheckStats


@dataclass
class RequestCounters:
    """Reused prompt tokens over prompt tokens is the hit rate."""

    requests: int = 0
    prompt_tokens: int = 0
    reused_tokens: int = 0
    reused_by_tier: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REUSING_TIERS, 0))

    @property
    def hit_rate(self) -> float:
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
