"""The RAM tier: byte budget, LRU order, sliding TTL, pinning."""

from __future__ import annotations

from cache.ram_tier import RamTier


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_least_recently_used_goes_first() -> None:
    ram = RamTier(budget_bytes=30, ttl_seconds=100)
    for key in (b"a", b"b", b"c"):
        ram.put(key, b"x" * 10)
    assert ram.get(b"a") is not None  # a is now the most recent
    ram.put(b"d", b"x" * 10)
    assert b"b" not in ram and b"a" in ram and ram.bytes_used == 30
    assert ram.counters.evictions == 1


def test_ttl_slides_with_use_and_pinned_blocks_stay() -> None:
    clock = Clock()
    ram = RamTier(budget_bytes=100, ttl_seconds=10, clock=clock)
    ram.put(b"used", b"1")
    ram.put(b"idle", b"2")
    ram.put(b"pinned", b"3", pinned=True)
    clock.now = 8
    assert ram.get(b"used") == b"1"
    clock.now = 15
    assert ram.get(b"idle") is None and ram.counters.expirations == 1
    assert ram.get(b"used") == b"1" and ram.get(b"pinned") == b"3"
    clock.now = 100
    assert ram.prune() == 1 and b"pinned" in ram


def test_pinned_blocks_survive_pressure() -> None:
    ram = RamTier(budget_bytes=20, ttl_seconds=100)
    ram.put(b"persona", b"p" * 10, pinned=True)
    for key in (b"a", b"b", b"c"):
        ram.put(key, b"x" * 10)
    assert b"persona" in ram and b"c" in ram and b"a" not in ram
