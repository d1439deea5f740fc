"""Eviction policies on hand-made blocks, and the RAM tier evicting by them."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from cache.eviction import (
    HALF_LIFE_EVICTIONS,
    HALF_LIFE_SHARE_OF_IDLE,
    BlockPlace,
    LazyHeap,
    LfuPolicy,
    LruPolicy,
    ValuePolicy,
    make_policy,
    recompute_cost,
)
from cache.keys import BlockKey as K
from cache.prefix_cache import CacheConfig, PrefixCache
from cache.ram_tier import RamTier
from chatapp.benchmark.trace_replay import BYTES_PER_TOKEN, replay
from chatapp.benchmark.traces import make_trace
from tests.cache.test_prefix_cache import LAYOUT, namespace

HOUR = 3600.0


def first(tokens: int = 64) -> BlockPlace:
    return BlockPlace(None, 0, tokens)


def after(parent: bytes, start: int, tokens: int = 64) -> BlockPlace:
    return BlockPlace(K(parent), start, tokens)


def test_recompute_cost_grows_with_position() -> None:
    assert recompute_cost(0, 1, attention_tokens=100) == 1.0
    assert recompute_cost(0, 2, attention_tokens=100) == pytest.approx(1 + 1.01)  # positions 0 and 1
    assert recompute_cost(4000, 64) > 1.9 * recompute_cost(0, 64)


def test_value_policy_evicts_leaves_first() -> None:
    policy = ValuePolicy()
    policy.admit(K(b"a"), first(), 64, now=0)
    policy.admit(K(b"b"), after(b"a", 64), 64, now=0)
    policy.admit(K(b"c"), after(b"b", 128), 64, now=0)
    for _ in range(5):  # the leaf is the most used and the deepest: still the only candidate
        policy.touch(K(b"c"), now=1)
    assert policy.victim() == K(b"c")
    policy.forget(K(b"c"))
    assert policy.victim() == K(b"b")
    policy.forget(K(b"b"))
    assert policy.victim() == K(b"a")


def test_pinned_blocks_are_never_chosen_and_hold_their_parents() -> None:
    policy = ValuePolicy()
    policy.admit(K(b"persona"), first(), 64, now=0)
    policy.admit(K(b"pinned"), after(b"persona", 64), 64, now=0, pinned=True)
    assert policy.victim() is None  # the leaf is pinned, its parent has a kept child
    policy.admit(K(b"other"), first(), 64, now=0)
    assert policy.victim() == K(b"other")
    policy.set_pinned(K(b"pinned"), False)
    policy.forget(K(b"other"))
    assert policy.victim() == K(b"pinned")
    for choice in (LruPolicy(), LfuPolicy()):
        choice.admit(K(b"p"), first(), 64, now=0, pinned=True)
        assert choice.victim() is None


def test_uses_and_recompute_cost_raise_value() -> None:
    policy = ValuePolicy()
    policy.admit(K(b"used"), first(), 64, now=0)
    policy.admit(K(b"idle"), first(), 64, now=0)
    policy.touch(K(b"used"), now=1)
    assert policy.victim() == K(b"idle")
    assert policy.value(K(b"used"), 1) > policy.value(K(b"idle"), 1)

    deep = ValuePolicy()
    deep.admit(K(b"shallow"), after(b"x", 0), 64, now=0)
    deep.admit(K(b"deep"), after(b"y", 4000), 64, now=0)
    assert deep.victim() == K(b"shallow")  # same tokens and bytes, but far cheaper to compute again

    sized = ValuePolicy()
    sized.admit(K(b"small"), first(64), 1000, now=0)
    sized.admit(K(b"large"), first(64), 4000, now=0)
    assert sized.victim() == K(b"large")  # the same cost for four times the bytes


def test_old_uses_decay() -> None:
    policy = ValuePolicy(half_life_s=HOUR)
    policy.admit(K(b"busy long ago"), first(), 64, now=0)
    policy.touch(K(b"busy long ago"), now=0)
    policy.touch(K(b"busy long ago"), now=0)
    policy.admit(K(b"used now"), first(), 64, now=3 * HOUR)  # 3 uses x 1/8 < 1 use now
    assert policy.victim() == K(b"busy long ago")
    assert policy.value(K(b"busy long ago"), 3 * HOUR) == pytest.approx(policy.value(K(b"used now"), 3 * HOUR) * 3 / 8)


def test_a_block_evicted_and_stored_again_keeps_its_uses() -> None:
    policy = ValuePolicy()
    policy.admit(K(b"popular"), first(), 64, now=0)
    for _ in range(4):
        policy.touch(K(b"popular"), now=0)
    policy.forget(K(b"popular"))
    policy.admit(K(b"stranger"), first(), 64, now=1)
    policy.admit(K(b"popular"), first(), 64, now=1)
    assert policy.victim() == K(b"stranger")


def test_lfu_counts_uses_and_breaks_ties_by_recency() -> None:
    policy = LfuPolicy()
    for number, key in enumerate((b"a", b"b", b"c")):
        policy.admit(K(key), first(), 64, now=number)
    policy.touch(K(b"a"), now=5)
    assert policy.victim() == K(b"b")  # b and c used once; b less recently
    policy.touch(K(b"b"), now=6)
    assert policy.victim() == K(b"c")


def test_ram_tier_evicts_by_value_under_budget() -> None:
    now = [0.0]
    ram = RamTier(budget_bytes=40, ttl_seconds=1e9, clock=lambda: now[0], policy=ValuePolicy())
    ram.keep(K(b"persona"), b"p" * 10, place=first())
    ram.keep(K(b"doc"), b"d" * 10, place=after(b"persona", 64))
    ram.keep(K(b"one-off"), b"o" * 10, place=first())
    ram.keep(K(b"question"), b"q" * 10, place=after(b"doc", 128))
    for _ in range(3):
        now[0] += 1
        for key in (b"persona", b"doc", b"question"):
            assert ram.get(K(key)) is not None
    now[0] += 1
    ram.keep(K(b"new"), b"n" * 10, place=first())
    assert K(b"one-off") not in ram  # the least used leaf
    assert all(K(key) in ram for key in (b"persona", b"doc", b"question", b"new"))
    assert ram.bytes_used == 40
    ram.keep(K(b"big"), b"b" * 35, place=first())  # used once and the cheapest per byte: it goes itself
    assert K(b"big") not in ram
    assert all(K(key) in ram for key in (b"persona", b"doc", b"question", b"new"))
    assert ram.counters.evictions == 2


def test_eviction_keeps_a_heap_no_larger_than_the_blocks_kept() -> None:
    policy = ValuePolicy()
    ram = RamTier(budget_bytes=10_000 * 10, ttl_seconds=1e9, clock=lambda: 0.0, policy=policy)
    parent: K | None = None
    for number in range(30_000):  # chains of 10 blocks, two thirds of them evicted, each used again
        key = K(number.to_bytes(16, "little"))
        ram.keep(key, b"x" * 10, place=BlockPlace(parent, (number % 10) * 64, 64))
        ram.get(key)
        parent = None if number % 10 == 9 else key
    assert len(ram) == 10_000
    heap = LazyHeap()
    for number in range(10_000):
        heap.push(K(bytes([number % 10])), float(number))
    assert len(heap) == 10
    assert heap.entries <= 2 * 10 + 64  # stale entries are swept, not kept


@pytest.mark.parametrize("seed", range(6))
def test_a_hit_leaves_its_heap_entry_yet_the_victim_is_always_the_least_worth(seed: int) -> None:
    """A touch raises a block's worth without a heap push; whatever the order of uses, pins and evictions,
    the victim is the unpinned leaf worth least now (the value policy) or used least (LFU)."""
    rng = random.Random(seed)
    value, lfu = ValuePolicy(half_life_s=50.0), LfuPolicy()
    kept: dict[K, K | None] = {}  # key -> parent
    pinned: set[K] = set()
    uses: dict[K, tuple[int, float]] = {}  # LFU's reference: count, last use
    for step in range(600):
        now = float(step)
        action = rng.random()
        if action < 0.35 or len(kept) < 3:
            key = K(step.to_bytes(4, "little"))
            parent = rng.choice([None, *kept])
            place = BlockPlace(parent, rng.randrange(0, 4096, 64), 64)
            size = rng.choice([10, 100, 1000])
            value.admit(key, place, size, now)
            lfu.admit(key, place, size, now)
            kept[key] = parent
            uses[key] = (1, now)
        elif action < 0.85:
            key = rng.choice(list(kept))
            value.touch(key, now)
            lfu.touch(key, now)
            uses[key] = (uses[key][0] + 1, now)
        elif action < 0.9:
            key = rng.choice(list(kept))
            pin = key not in pinned
            value.set_pinned(key, pin)
            lfu.set_pinned(key, pin)
            pinned.symmetric_difference_update({key})
        else:
            parents = {parent for parent in kept.values() if parent is not None}
            leaves = [key for key in kept if key not in parents and key not in pinned]
            victim = value.victim()
            assert (victim is None) == (not leaves)
            if victim is not None:
                assert victim in leaves
                assert value.value(victim, now) <= min(value.value(key, now) for key in leaves) * (1 + 1e-9)
            unpinned = [key for key in kept if key not in pinned]
            assert lfu.victim() in ({min(unpinned, key=lambda key: uses[key])} if unpinned else {None})
            gone = victim if victim is not None else rng.choice(list(kept))
            for policy in (value, lfu):
                policy.forget(gone)
            del kept[gone], uses[gone]
            pinned.discard(gone)


def test_the_half_life_follows_how_long_the_tier_keeps_a_block_unused() -> None:
    """Blocks evicted after 80 s unused: the half-life becomes a quarter of that; a fixed one stays."""
    adaptive, fixed = ValuePolicy(), ValuePolicy(half_life_s=HOUR)
    assert adaptive.half_life_s == HOUR  # until the tier has evicted enough to tell
    for policy in (adaptive, fixed):
        for number in range(4 * HALF_LIFE_EVICTIONS):
            now = 10.0 * number
            policy.admit(K(number.to_bytes(4, "little")), first(), 64, now=now)
            if number >= 8:  # eight kept: each block goes 80 s after its only use
                victim = policy.victim()
                assert victim == K((number - 8).to_bytes(4, "little"))
                policy.forget(victim)
    assert adaptive.half_life_s == pytest.approx(80 * HALF_LIFE_SHARE_OF_IDLE, rel=0.05)
    assert fixed.half_life_s == HOUR


def test_at_a_tight_budget_the_value_policy_keeps_the_conversation_going_on() -> None:
    """An hour's memory of uses lets blocks popular a while ago crowd out the conversation in progress
    when the tier keeps a block only minutes: the adaptive half-life keeps up with LRU there."""
    trace = make_trace("zipf", 0.3)
    budget = 40 * trace.block_tokens * BYTES_PER_TOKEN
    lru, hour, adaptive = (
        replay(trace, policy, budget, 2 * 86400).hit_rate
        for policy in (LruPolicy(), ValuePolicy(half_life_s=HOUR), ValuePolicy())
    )
    assert adaptive >= lru - 0.01
    assert adaptive >= hour + 0.05


def test_the_cache_config_names_the_ram_tier_policy(tmp_path: Path) -> None:
    config = CacheConfig(block_size=4, ram_budget_bytes=1 << 20, disk_budget_bytes=1 << 24, eviction_policy="lru")
    cache = PrefixCache(tmp_path, namespace(), LAYOUT, config)
    try:
        assert cache.ram.policy.name == "lru"
        assert cache.stats()["ram"]["eviction_policy"] == "lru"
    finally:
        cache.close()
    assert CacheConfig().eviction_policy == "value"
    with pytest.raises(ValueError, match="eviction_policy"):
        CacheConfig(eviction_policy="random")
    with pytest.raises(ValueError, match="unknown eviction policy"):
        make_policy("fifo")
