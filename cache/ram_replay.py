"""What each process's RAM tier kept when each logged request came, replayed under an eviction policy.

Sizing advice (cache/sizing.py) counts LRU's stack distances in one pass; a policy that is not a
stack algorithm (the value policy, LFU) has to be replayed at each budget. This replays the log the
way the RAM tier works (ram_tier.py): one tier per process, empty at its start; a store keeps its
entries deepest first; a request finds what is kept and unexpired, then uses the entries past what
the live context held, deepest first (a use of one not kept brings it back, as a restore from disk
does); the policy (cache/eviction.py's own class) chooses victims while the tier is over budget;
a sliding TTL. Only the keys of the sample are replayed, at the sample's share of the budget.
"""

from __future__ import annotations

from typing import Protocol, cast

import numpy as np

from cache.eviction import BlockPlace, EvictionPolicy, make_policy
from cache.keys import BlockKey
from cache.request_log import LogColumns


class Queries(Protocol):
    """The rows sizing asks about: a request, a key and where it ends."""

    @property
    def request(self) -> np.ndarray: ...
    @property
    def end(self) -> np.ndarray: ...
    @property
    def key(self) -> np.ndarray: ...


class BlockQueries(Queries, Protocol):
    """Blocks also say where they start."""

    @property
    def start(self) -> np.ndarray: ...


class _Tier:
    """One process's RAM tier: sizes and last uses, and the policy that picks victims."""

    def __init__(self, budget: float, ttl_s: float, policy: EvictionPolicy) -> None:
        self.budget, self.ttl_s, self.policy = budget, ttl_s, policy
        self.kept: dict[BlockKey, tuple[int, float]] = {}  # key -> (bytes, last use)
        self.used = 0

    def holds(self, key: BlockKey, now: float) -> bool:
        slot = self.kept.get(key)
        if slot is None:
            return False
        if now - slot[1] > self.ttl_s:  # expired: dropped when read, as the tier does
            self._drop(key)
            return False
        return True

    def use(self, key: BlockKey, size: int, place: BlockPlace, now: float) -> None:
        """A store or a restore of `key`: kept again if it was, brought back if not; then over budget, evict."""
        slot = self.kept.get(key)
        if slot is not None:
            if now - slot[1] <= self.ttl_s:
                self.kept[key] = (slot[0], now)
                self.policy.touch(key, now)
                return
            self._drop(key)  # expired
        if size > self.budget:
            return
        self.kept[key] = (size, now)
        self.used += size
        self.policy.admit(key, place, size, now)
        while self.used > self.budget:
            victim = self.policy.victim()
            if victim is None:
                break
            self._drop(victim)

    def _drop(self, key: BlockKey) -> None:
        size, _ = self.kept.pop(key)
        self.used -= size
        self.policy.forget(key)


def _keys(values: np.ndarray) -> list[BlockKey]:
    """Short keys as the policy's keys. They stay ints: a policy only hashes and compares its keys, and
    making 8-byte strings of them would cost more than the replay's own work on a long log."""
    return cast(list[BlockKey], values.tolist())


def replay_ram(
    log: LogColumns,
    blocks: BlockQueries,
    marks: Queries,
    budget: float,
    ttl_s: float,
    policy: str,
    entry_kept: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """For each row of `blocks` and of `marks`: whether its process's RAM tier, replayed under `policy`
    at `budget` bytes, held it when its request came. `entry_kept`: the stored entries in the sample."""
    tiers: dict[int, _Tier] = {}
    sizes: dict[BlockKey, int] = {}
    places: dict[BlockKey, BlockPlace] = {}
    in_ram_blocks = [False] * blocks.request.size
    in_ram_marks = [False] * marks.request.size
    requests, stores = log.requests, log.store_time.size
    # Python lists: this loop reads one value at a time, which numpy scalars make several times slower.
    block_bounds = np.searchsorted(blocks.request, np.arange(requests + 1))
    mark_bounds = np.searchsorted(marks.request, np.arange(requests + 1))
    block_rows, mark_rows = block_bounds.tolist(), mark_bounds.tolist()
    block_key, block_end = _keys(blocks.key), blocks.end.tolist()
    block_start = blocks.start.tolist()
    mark_key, mark_end = _keys(marks.key), marks.end.tolist()
    # Only the sample's entries are replayed (their columns, in order), and only the events that touch one.
    kept_entries = np.flatnonzero(entry_kept)
    entry_size = log.entry_size[kept_entries].tolist()
    entry_key, entry_parent = _keys(log.entry_key[kept_entries]), _keys(log.entry_parent[kept_entries])  # 0: root
    entry_start = log.entry_start[kept_entries].tolist()
    entry_tokens = log.entry_tokens[kept_entries].tolist()
    store_kept = np.searchsorted(kept_entries, log.entry_offsets)
    store_session, request_session = log.store_session.tolist(), log.request_session.tolist()
    in_places = log.in_place.tolist()
    times = np.concatenate([log.request_time, log.store_time])
    is_store = np.concatenate([np.zeros(requests, dtype=bool), np.ones(stores, dtype=bool)])
    rows = np.concatenate([np.arange(requests), np.arange(stores)])
    asks = np.diff(block_bounds) + np.diff(mark_bounds)
    acting = np.concatenate([asks > 0, np.diff(store_kept) > 0])
    order = np.lexsort((is_store, times))
    order = order[acting[order]]
    store_kept = store_kept.tolist()
    for number, now, storing in zip(rows[order].tolist(), times[order].tolist(), is_store[order].tolist(), strict=True):
        session = store_session[number] if storing else request_session[number]
        tier = tiers.get(session)
        if tier is None:
            tier = tiers[session] = _Tier(budget, ttl_s, make_policy(policy))
        if storing:
            for entry in range(store_kept[number + 1] - 1, store_kept[number] - 1, -1):  # deepest first
                key = entry_key[entry]
                sizes[key] = entry_size[entry]
                places[key] = BlockPlace(entry_parent[entry] or None, entry_start[entry], entry_tokens[entry])
                tier.use(key, sizes[key], places[key], now)
            continue
        in_place = in_places[number]
        first_block, last_block = block_rows[number], block_rows[number + 1]
        first_mark, last_mark = mark_rows[number], mark_rows[number + 1]
        holds, use = tier.holds, tier.use
        for row in range(first_block, last_block):
            in_ram_blocks[row] = holds(block_key[row], now)
        if first_mark < last_mark:
            for row in range(first_mark, last_mark):
                in_ram_marks[row] = holds(mark_key[row], now)
            used = sorted((mark_end[row], row) for row in range(first_mark, last_mark) if mark_end[row] > in_place)
            for _, row in reversed(used):
                key = mark_key[row]
                if key in sizes:
                    use(key, sizes[key], places[key], now)
        for row in range(last_block - 1, first_block - 1, -1):
            key = block_key[row]
            if block_end[row] > in_place and key in sizes:
                place = places.get(key)
                if place is None:
                    start = block_start[row]
                    place = BlockPlace(block_key[row - 1] if row > first_block else None, start, block_end[row] - start)
                use(key, sizes[key], place, now)
    return np.array(in_ram_blocks, dtype=bool), np.array(in_ram_marks, dtype=bool)
