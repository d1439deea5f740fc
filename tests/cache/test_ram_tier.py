"""The RAM tier: byte budget, LRU order, sliding TTL, pinning."""

from __future__ import annotations

import pytest

from cache.eviction import make_policy
from cache.keys import BlockKey as K
from cache.ram_tier import RamTier
from tests.cache.test_disk_tier import block


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("policy", [None, "lru"], ids=["default", "lru"])
def test_least_recently_used_goes_first(policy: str | None) -> None:
    ram = RamTier(budget_bytes=30, ttl_seconds=100, policy=make_policy(policy) if policy else None)
    for key in (K(b"a"), K(b"b"), K(b"c")):
        ram.keep(key, b"x" * 10)
    assert ram.get(K(b"a")) is not None  # a is now the most recent
    ram.keep(K(b"d"), b"x" * 10)
    assert K(b"b") not in ram
    assert K(b"a") in ram
    assert ram.bytes_used == 30
    assert ram.counters.evictions == 1


def test_ttl_slides_with_use_and_pinned_blocks_stay() -> None:
    clock = Clock()
    ram = RamTier(budget_bytes=100, ttl_seconds=10, clock=clock)
    ram.keep(K(b"used"), b"1")
    ram.keep(K(b"idle"), b"2")
    ram.keep(K(b"pinned"), b"3", pinned=True)
    clock.now = 8
    assert ram.get(K(b"used")) == b"1"
    clock.now = 15
    assert ram.get(K(b"idle")) is None
    assert ram.counters.expirations == 1
    assert ram.get(K(b"used")) == b"1"
    assert ram.get(K(b"pinned")) == b"3"
    clock.now = 100
    assert ram.prune() == 1
    assert K(b"pinned") in ram


def test_pinned_blocks_survive_pressure() -> None:
    ram = RamTier(budget_bytes=20, ttl_seconds=100)
    ram.keep(K(b"persona"), b"p" * 10, pinned=True)
    for key in (K(b"a"), K(b"b"), K(b"c")):
        ram.keep(key, b"x" * 10)
    assert K(b"persona") in ram
    assert K(b"c") in ram
    assert K(b"a") not in ram


def test_it_would_keep_a_prefixs_first_entries_within_its_budget_and_the_pinned_ones() -> None:
    ram = RamTier(budget_bytes=30, ttl_seconds=100)
    prefix = [block(1, b"a" * 10), block(2, b"b" * 15), block(3, b"c" * 10), block(4, b"d" * 3, pinned=True)]
    assert ram.would_keep(prefix) == [True, True, False, True]
    assert RamTier(budget_bytes=25, ttl_seconds=100).would_keep(prefix[:2]) == [True, True]
    assert RamTier(budget_bytes=24, ttl_seconds=100).would_keep(prefix[:2]) == [True, False]
