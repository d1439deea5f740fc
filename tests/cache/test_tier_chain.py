"""The tiers behind one interface: a tier of one file (tests/cache/memory_tier.py) joins RAM and disk, serves
what they lost byte for byte, and its faults cost hits, never a wrong restore or a failed store."""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cache.disk_tier import DiskTier
from cache.prefix_cache import PrefixCache
from cache.ram_tier import RamTier
from cache.state_assembly import StateAssembly
from cache.state_format import StateFormatError
from cache.tier import Tier
from cache.tiers import ReuseTier
from tests.cache.memory_tier import MemoryTier
from tests.cache.test_prefix_cache import CONFIG, LAYOUT, TOKENS, namespace, restored_state, store_sequence


def cache_with(folder: Path, tier: MemoryTier) -> PrefixCache:
    return PrefixCache(folder, namespace(), LAYOUT, CONFIG, more_tiers=[tier])


def faster_tiers_emptied(cache: PrefixCache) -> None:
    cache.ram.clear()
    cache.disk.clear()


def test_ram_disk_and_a_new_tier_meet_the_one_interface(tmp_path: Path) -> None:
    """Every member of `Tier`, with the protocol's parameters (mypy checks the types of the same list)."""
    tiers: list[Tier] = [RamTier(1 << 20, 60.0), DiskTier(tmp_path, 1 << 20, 60.0, b"n" * 8), MemoryTier()]
    members = [name for name in vars(Tier) if not name.startswith("_")]
    assert {"read_into", "put", "holding", "discard", "storing", "stats"} <= set(members)
    for tier in tiers:
        for name in members:
            wanted = inspect.signature(getattr(Tier, name)).parameters
            got = inspect.signature(getattr(type(tier), name)).parameters
            assert list(got) == list(wanted), (type(tier).__name__, name)
        assert isinstance(tier.name, ReuseTier)
        assert isinstance(tier.checks_payloads, bool)
        assert isinstance(tier.enabled, bool)


def test_a_new_tier_keeps_every_entry_and_serves_what_ram_and_disk_lost_byte_for_byte(tmp_path: Path) -> None:
    extra = MemoryTier()
    cache = cache_with(tmp_path, extra)
    blob = store_sequence(cache, TOKENS)
    assert extra.stores == 1  # one store, one `storing` around its blocks
    assert set(extra.kept) == set(cache.index.entries)
    faster_tiers_emptied(cache)
    state, matched, _tier = restored_state(cache, [*TOKENS, 999])
    assert (state, matched) == (blob, len(TOKENS))
    assert all(info.key in cache.ram for info in cache.index.entries.values())  # RAM keeps what it served
    state, _, tier = restored_state(cache, [*TOKENS, 999])
    assert (state, tier) == (blob, "ram")
    cache.close()


def test_what_ram_serves_is_marked_used_in_every_slower_tier(tmp_path: Path) -> None:
    extra = MemoryTier()
    cache = cache_with(tmp_path, extra)
    store_sequence(cache, TOKENS)
    restored_state(cache, [*TOKENS, 999])  # flushes: the refresh ran on the writer
    assert set(extra.touched) == set(cache.index.entries)
    cache.close()


def test_damaged_bytes_from_a_tier_that_does_not_check_are_never_restored(tmp_path: Path) -> None:
    extra = MemoryTier()
    cache = cache_with(tmp_path, extra)
    store_sequence(cache, TOKENS)
    faster_tiers_emptied(cache)
    extra.faults.damage_reads = True
    found = cache.lookup(np.asarray(TOKENS))
    assert found.tokens == len(TOKENS)
    assert cache.fetch(found, np.asarray(TOKENS)) is None
    assert len(cache.index) == 0  # lost everywhere: forgotten, to be stored again when computed
    cache.close()


def test_a_tier_that_fails_costs_a_hit_never_a_restore_or_a_store(tmp_path: Path) -> None:
    extra = MemoryTier()
    cache = cache_with(tmp_path, extra)
    extra.faults.fail_writes = True
    blob = store_sequence(cache, TOKENS)
    assert extra.kept == {}
    assert set(cache.disk.holding(list(cache.index.entries.values()))) == set(cache.index.entries)
    extra.faults = type(extra.faults)(fail_reads=True)
    cache.ram.clear()
    state, _, tier = restored_state(cache, [*TOKENS, 999])  # the disk still has it all
    assert (state, tier) == (blob, "disk")
    faster_tiers_emptied(cache)
    assert cache.fetch(cache.lookup(np.asarray(TOKENS)), np.asarray(TOKENS)) is None
    cache.close()


def test_pins_forgetting_and_clearing_reach_the_new_tier(tmp_path: Path) -> None:
    extra = MemoryTier()
    cache = cache_with(tmp_path, extra)
    store_sequence(cache, TOKENS)
    keys = set(cache.index.entries)
    assert cache.pin(TOKENS) == len(keys)
    assert extra.pinned == keys
    assert cache.pin(TOKENS, pinned=False) == len(keys)
    assert extra.pinned == set()
    assert cache.forget([TOKENS]) == len(keys)
    assert extra.kept == {}
    store_sequence(cache, TOKENS)
    assert cache.clear() == len(keys)
    assert extra.kept == {}
    cache.close()


def test_a_tier_failing_at_its_upkeep_leaves_every_request_working(tmp_path: Path) -> None:
    extra = MemoryTier()
    cache = cache_with(tmp_path, extra)
    extra.faults.fail_upkeep = True  # holding, storing, touch, discard, pins and new entries all raise
    blob = store_sequence(cache, TOKENS)
    state, _, tier = restored_state(cache, [*TOKENS, 999])
    assert (state, tier) == (blob, "ram")
    keys = set(cache.index.entries)
    assert cache.has_new_blocks(TOKENS) is False
    assert cache.pin(TOKENS) == len(keys)
    assert cache.forget([[*TOKENS, 5]]) == 0  # pinned: kept
    cache.close()


def test_the_assemblys_own_failure_is_not_taken_for_a_tiers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A state that cannot be assembled is a miss for this request; the entries it read stay stored."""
    cache = cache_with(tmp_path, MemoryTier())
    store_sequence(cache, TOKENS)
    cache.ram.clear()

    def refuse(*_args: object) -> None:
        raise StateFormatError("a piece of the wrong size")

    monkeypatch.setattr(StateAssembly, "fill", refuse)
    assert cache.fetch(cache.lookup(np.asarray(TOKENS)), np.asarray(TOKENS)) is None
    keys = set(cache.index.entries)
    assert len(keys) == 3
    assert cache.disk.holding(list(cache.index.entries.values())) == keys
    cache.close()


def test_a_pass_that_lost_a_block_counts_as_read_from_the_slowest_tier(tmp_path: Path) -> None:
    """RAM served the first blocks, the last was lost everywhere: the prefix short of it was found only after
    every tier was asked, and reuse is counted where the time went."""
    cache = cache_with(tmp_path, MemoryTier())
    blob = store_sequence(cache, TOKENS)
    last = max(cache.index.entries.values(), key=lambda info: info.start)
    cache.ram.discard(last)
    cache.disk.discard(last)
    cache.tiers.tiers[2].discard(last)
    state, matched, tier = restored_state(cache, [*TOKENS, 999])
    assert matched == last.start
    assert tier == "disk"
    assert state != blob  # the shorter state
    cache.close()


def test_a_new_tier_shows_its_own_figures_in_the_stats(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, MemoryTier())
    store_sequence(cache, TOKENS)
    assert cache.stats()["more_tiers"] == [{"entries": len(cache.index.entries)}]
    cache.close()


def test_a_prefix_larger_than_rams_budget_is_read_into_kept_memory_only_as_far_as_the_budget(tmp_path: Path) -> None:
    """RAM keeps a prefix's first blocks as far as its budget goes: only those are read into memory it keeps,
    the rest through the readers' scratch, so a large prefix never holds all its blocks beside its state."""
    extra = MemoryTier()
    first = cache_with(tmp_path / "sizes", MemoryTier())
    blob = store_sequence(first, TOKENS)
    sizes = [info.payload_size for info in sorted(first.index.entries.values(), key=lambda info: info.start)]
    first.close()
    assert len(sizes) == 3
    small = PrefixCache(
        tmp_path / "small",
        namespace(),
        LAYOUT,
        replace(CONFIG, ram_budget_bytes=sizes[0] + sizes[1]),
        more_tiers=[extra],
    )
    assert store_sequence(small, TOKENS) == blob
    faster_tiers_emptied(small)
    state, matched, _tier = restored_state(small, [*TOKENS, 999])
    assert (state, matched) == (blob, len(TOKENS))
    assert extra.keeps_asked[-1] == [True, True, False]
    kept = [info.key in small.ram for info in sorted(small.index.entries.values(), key=lambda info: info.start)]
    assert kept == [True, True, False]
    small.close()
