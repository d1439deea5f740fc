"""Counters per tier, and the cache-wide hit rate."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class TierCounters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    expirations: int = 0
    bytes_written: int = 0
    bytes_read: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class RequestCounters:
    """Reused prompt tokens over prompt tokens is the hit rate."""

    requests: int = 0
    prompt_tokens: int = 0
    reused_tokens: int = 0
    reused_by_tier: dict[str, int] = field(default_factory=lambda: {"device": 0, "ram": 0, "disk": 0})

    @property
    def hit_rate(self) -> float:
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
