"""Sizing advice: the tokens the user's own requests would have reused at other budgets and TTLs.

From the request log (cache/request_log.py), one pass of Mattson's stack algorithm gives every
block use its stack distance: the bytes of distinct entries used since its last use, itself
included. Under LRU a use hits at a budget of B bytes exactly when its distance is at most B
and, with a sliding TTL, its last use was at most TTL ago, so one pass answers every budget.

The model is the cache's own: stores add entries; a request reuses the longest prefix whose
blocks (and, for a model that restores at checkpoints, a checkpoint at its end) are all kept,
at most `limit` tokens, and never less than the live context held in place; it uses the blocks
past that part (so they move up), deepest first, so a parent is never older than its child. The
disk tier is one LRU stack over every process; each process's RAM tier is its own stack, empty
at start (the RAM tier evicts by value by default: its LRU curve is a close bound, not exact).

The distances come from counting, not from replaying: the bytes between two uses are the
groups of uses (an event and when its entries are next used) that lie between them and are not
used again before the second, a 2-D dominance count (cache/dominance.py) done in numpy.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np

from cache.dominance import dominance_sums
from cache.eviction import ATTENTION_TOKENS
from cache.ram_replay import replay_ram
from cache.request_log import TIER_CODES, LogColumns
from cache.tiers import ReuseTier

NEVER = np.iinfo(np.int64).max // 4  # a distance no budget reaches: never stored, or expired
# Past this many block queries the log is sampled (SHARDS: keys kept by a hash of their own, distances
# and tokens scaled by the rate), so 100,000 requests of any length take about a second.
FULL_QUERIES = 300_000
# A policy's RAM tier is replayed (a Python loop) on this share of a sampled log's keys; LRU's pass takes them all.
REPLAY_SHARE = 1 / 8
MIN_MEASURED_TOKENS = 16  # shorter prefills are mostly fixed cost: no measure of the speed


@dataclass(frozen=True)
class Gains:
    """What each budget adds: reused tokens gained (and their prefill cost) once the budget reaches
    `distance`, sorted by distance; reuse at budget B is `floor` plus the gains at distances <= B."""

    distance: np.ndarray  # bytes (float64: scaled when sampled)
    tokens: np.ndarray  # float64 (estimates when sampled)
    cost: np.ndarray  # float64, token-times (eviction.recompute_cost's units)
    floor: int  # tokens reused whatever the budget (held in place by the live context)

    def reused_at(self, budget: float) -> int:
        return self.floor + round(float(self.tokens[: np.searchsorted(self.distance, budget, side="right")].sum()))

    def cost_at(self, budget: float) -> float:
        return float(self.cost[: np.searchsorted(self.distance, budget, side="right")].sum())

    def reused_curve(self, budgets: Sequence[float]) -> list[int]:
        running = np.concatenate(([0], np.cumsum(self.tokens)))
        return [self.floor + round(float(running[np.searchsorted(self.distance, b, side="right")])) for b in budgets]


def _plus_difference(base: Gains, plus: Gains, minus: Gains) -> Gains:
    """`base` plus the difference `plus` - `minus` (their floors are the same), never less at a larger budget
    (an estimate's noise may say so; a larger budget keeps all a smaller one does)."""
    distance = np.concatenate([base.distance, plus.distance, minus.distance])
    order = np.argsort(distance, kind="stable")

    def rising(steps: np.ndarray) -> np.ndarray:
        """The steps of the largest non-decreasing curve, from 0, never above this one (same total)."""
        running = np.cumsum(steps[order])
        return np.diff(np.maximum(np.minimum.accumulate(running[::-1])[::-1], 0.0), prepend=0.0)

    tokens = rising(np.concatenate([base.tokens, plus.tokens, -minus.tokens]))
    cost = rising(np.concatenate([base.cost, plus.cost, -minus.cost]))
    return Gains(distance[order], tokens, cost, base.floor)


def enough_budget(gains: Gains, budgets: Sequence[float], within_tokens: float) -> float:
    """The smallest of `budgets` (ascending) whose reuse is within `within_tokens` of an unlimited budget's."""
    best = gains.reused_at(math.inf)
    return next((budget for budget in budgets if gains.reused_at(budget) >= best - within_tokens), math.inf)


@dataclass(frozen=True)
class _Blocks:
    """The blocks the log's requests could reuse, in request and chain order, with their stack distances."""

    request: np.ndarray  # index into the requests
    start: np.ndarray  # its first position
    end: np.ndarray  # position after the block
    disk: np.ndarray  # distance in the shared (disk) stack; NEVER when never stored before
    ram: np.ndarray  # distance in its process's (RAM) stack
    age: np.ndarray  # seconds since its last use (inf when none)
    ram_age: np.ndarray  # seconds since its process last used it
    key: np.ndarray  # uint64 short key


@dataclass(frozen=True)
class _Checkpoints:
    request: np.ndarray
    end: np.ndarray
    disk: np.ndarray
    ram: np.ndarray
    age: np.ndarray
    ram_age: np.ndarray
    anchor: np.ndarray  # a restore to `end` needs the chain blocks before this position
    key: np.ndarray  # uint64 short key


class RequestHistory:
    """The log's requests and their stack distances; asked for reuse at any budgets and TTL."""

    def __init__(self, log: LogColumns, sample_rate: float | None = None) -> None:
        """`sample_rate`: the share of keys kept (None: all of them unless the log is long)."""
        self.requests = log.requests
        self.prompt_tokens = int(log.prompt.sum())
        self.measured_reused = int(log.reused.sum())
        times = np.concatenate([log.request_time, log.store_time])
        self.first_time = float(times.min()) if times.size else 0.0
        self.last_time = float(times.max()) if times.size else 0.0
        self._in_place = np.minimum(log.in_place, log.prompt)
        self._limit = np.minimum(log.limit, log.prompt)
        queries = int(log.chain.size + log.mark_key.size)
        # A checkpoint model's reuse is the best of a few points, which a sample of keys cannot estimate.
        long_plain = not log.at_checkpoints.any() and queries > FULL_QUERIES
        self.sample_rate = sample_rate if sample_rate is not None else (FULL_QUERIES / queries if long_plain else 1.0)
        # When each chain block was first stored: millions of lookups on a long log, so done once, and only
        # for what needs it (the stores inferred from before the log, and the sample's ratio estimate).
        needed = self.sample_rate < 1.0 or _restored(log).any()
        first_stores = _FirstStores(log)
        chain_first = first_stores.of(log.chain) if needed else np.zeros(0)
        log, chain_first = _with_earlier_stores(log, chain_first, first_stores)
        self._blocks, self._checkpoints = _measure(log, self.sample_rate)
        self.log = log  # with the stores inferred from before it began
        # A RAM replay takes the keys kept at this rate (a share of the sample's: see `_replay_share`).
        self._replay_rate = self.sample_rate
        self._entry_kept = _sampled(log.entry_key, self.sample_rate)
        self.stored_bytes = _stored_bytes(log)
        self._token_scale = 1.0 / self.sample_rate
        self._reusable: float | None = None  # tokens an unlimited cache reuses (exact), when sampled
        self._share: RequestHistory | None = None
        if self.sample_rate < 1.0:
            # A ratio estimate: the sample's tokens scaled to the exact count of tokens any budget could
            # reuse (stored before, with every block before them), so popular blocks in or out of the sample
            # do not swing the whole curve.
            sampled = self._unbounded_blocks_tokens()
            if sampled > 0:
                self._reusable = _reusable_tokens(log, self._in_place, self._limit, chain_first)
                self._token_scale = self._reusable / sampled

    @property
    def seconds(self) -> float:
        return self.last_time - self.first_time

    def prefill_ms_per_cost(self) -> float | None:
        """Milliseconds per token-time of prefill, from the requests' own prefill times (None: too few logged).

        The slope of a line through (token-times computed, prefill ms): a prefill also pays a fixed cost
        per call (and the first one a cold start), which reused tokens do not save."""
        log = self.log
        measured = (log.prefill_ms > 0) & (log.prompt - log.reused >= MIN_MEASURED_TOKENS)
        units = _cost(log.reused[measured], log.prompt[measured])
        milliseconds = log.prefill_ms[measured]
        if units.size < 2 or np.ptp(units) == 0:
            return float(milliseconds.sum() / units.sum()) if units.size and units.sum() > 0 else None
        slope, _ = np.polyfit(units, milliseconds, 1)
        return float(slope) if slope > 0 else float(milliseconds.sum() / units.sum())

    def gains(self, ttl_s: float, ram_budget: float | None = None, tier: str = "any", ram_policy: str = "lru") -> Gains:
        """Reuse against the disk budget (tier "any": a block kept in RAM within `ram_budget` counts as
        kept whatever the disk budget) or against the RAM budget (tier "ram": restored from RAM alone).

        With another `ram_policy` than LRU (cache/eviction.py's "value", "lfu"), what the RAM tier keeps
        at `ram_budget` comes from a replay of each process's RAM tier under that policy (ram_replay.py).
        On a sampled log that replay runs on a share of the sample (REPLAY_SHARE, by the same hash): the
        policy's difference from LRU there, both replayed on the same keys so that their sampling noise
        cancels, is added to LRU's one pass over the whole sample (a control variate)."""
        # A RAM tier that could hold every entry the log stored never evicts, whatever its policy: LRU's pass.
        if ram_policy == "lru" or ram_budget is None or tier != "any" or self.stored_bytes <= ram_budget:
            return self._gains(ttl_s, ram_budget, tier, None)
        if self.sample_rate < 1.0:
            share = self._replay_share()
            if share is not None:
                by_policy = share._gains(ttl_s, ram_budget, tier, share._replay(ram_budget, ttl_s, ram_policy))
                by_lru = share._gains(ttl_s, ram_budget, tier, share._replay(ram_budget, ttl_s, "lru"))
                return _plus_difference(self._gains(ttl_s, ram_budget, tier, None), by_policy, by_lru)
        return self._gains(ttl_s, ram_budget, tier, self._replay(ram_budget, ttl_s, ram_policy))

    def _replay(self, ram_budget: float, ttl_s: float, policy: str) -> tuple[np.ndarray, np.ndarray]:
        """What each process's RAM tier, replayed under `policy`, held of each block and checkpoint."""
        budget = ram_budget * self._replay_rate  # the replayed keys' bytes
        return replay_ram(self.log, self._blocks, self._checkpoints, budget, ttl_s, policy, self._entry_kept)

    def _replay_share(self) -> RequestHistory | None:
        """This history on REPLAY_SHARE of its sample's keys (a subset: the same hash), for replays: the same
        stack distances, its tokens scaled to the same exact total. None when there is no such total or the
        share holds no block that could be reused. Made once."""
        if self._share is None and self._reusable is not None:
            share = copy.copy(self)
            share._replay_rate = self.sample_rate * REPLAY_SHARE
            blocks, marks = self._blocks, self._checkpoints
            kept = _sampled(blocks.key, share._replay_rate)
            share._blocks = _Blocks(*(getattr(blocks, column.name)[kept] for column in fields(_Blocks)))
            kept = _sampled(marks.key, share._replay_rate)
            share._checkpoints = _Checkpoints(*(getattr(marks, column.name)[kept] for column in fields(_Checkpoints)))
            share._entry_kept = _sampled(self.log.entry_key, share._replay_rate)
            tokens = share._unbounded_blocks_tokens()
            if tokens > 0:
                share._token_scale = self._reusable / tokens
                self._share = share
        return self._share

    def _gains(
        self, ttl_s: float, ram_budget: float | None, tier: str, replayed: tuple[np.ndarray, np.ndarray] | None
    ) -> Gains:
        """`gains` with what the RAM tier held replayed (None: LRU's stack distances say it)."""
        blocks, marks = self._blocks, self._checkpoints
        # The distances are the sample's bytes: a budget is compared with them at the sample's scale.
        sampled_ram = ram_budget * self.sample_rate if ram_budget is not None else None
        chain = _prefix_max(
            _tier_distance(blocks, ttl_s, sampled_ram, tier, replayed[0] if replayed else None), blocks.request
        )
        # Requests with marks (checkpoints, or a match ending inside a stored block) take the best of
        # their points; the others (most) add up their blocks, which a sample can estimate.
        with_marks = self.log.at_checkpoints.copy()
        with_marks[marks.request] = True
        alone = ~with_marks[blocks.request]
        request = blocks.request[alone]
        lowest = np.maximum(blocks.start[alone], self._in_place[request])
        highest = np.minimum(blocks.end[alone], self._limit[request])
        gained = highest - lowest
        useful = (gained > 0) & (chain[alone] < NEVER)
        parts = [(chain[alone][useful], gained[useful], _cost(lowest[useful], highest[useful]))]
        if marks.request.size:
            needed = _needed_chain(blocks.request, blocks.end, chain, marks.request, marks.anchor)
            needed[self.log.without_blocks[marks.request]] = 0  # a recurrent model's checkpoint restores alone
            own = np.maximum(needed, _tier_distance(marks, ttl_s, sampled_ram, tier, replayed[1] if replayed else None))
            plain = ~self.log.at_checkpoints[blocks.request] & ~alone
            parts.append(
                _envelope(
                    np.concatenate([blocks.request[plain], marks.request]),
                    np.concatenate([blocks.end[plain], marks.end]),
                    np.concatenate([chain[plain], own]),
                    self._in_place,
                    self._limit,
                )
            )
        distance, tokens, cost = (np.concatenate(column) for column in zip(*parts, strict=True))
        order = np.argsort(distance, kind="stable")
        return Gains(
            distance[order].astype(np.float64) / self.sample_rate,
            tokens[order].astype(np.float64) * self._token_scale,
            cost[order] * self._token_scale,
            int(self._in_place.sum()),
        )

    def _unbounded_blocks_tokens(self) -> float:
        """The sampled blocks' tokens past what was held in place that an unlimited cache without TTL reuses."""
        blocks = self._blocks
        reachable = _prefix_max(np.where(blocks.disk < NEVER, 0, NEVER), blocks.request) < NEVER
        lowest = np.maximum(blocks.start, self._in_place[blocks.request])
        highest = np.minimum(blocks.end, self._limit[blocks.request])
        return float(np.maximum(highest - lowest, 0)[reachable].sum())


def _needed_chain(
    block_request: np.ndarray, block_end: np.ndarray, chain: np.ndarray, request: np.ndarray, anchor: np.ndarray
) -> np.ndarray:
    """For each checkpoint: the chain distance of the last (kept, when sampled) block of its request
    ending at or before its anchor; 0 where there is none."""
    stride = int(max(block_end.max(initial=0), anchor.max(initial=0))) + 1
    ordered = block_request.astype(np.int64) * stride + block_end
    found = np.searchsorted(ordered, request.astype(np.int64) * stride + anchor, side="right") - 1
    valid = found >= 0
    valid[valid] = block_request[found[valid]] == request[valid]
    needed = np.zeros(request.size, dtype=np.int64)
    needed[valid] = chain[found[valid]]
    return needed


def _reusable_tokens(log: LogColumns, in_place: np.ndarray, limit: np.ndarray, first_stored: np.ndarray) -> float:
    """Tokens past what was held in place, within the limit, in chain blocks stored (`first_stored`: when,
    per chain block) before their request together with every block before them: what an unlimited cache
    without TTL reuses (exact, every block). Per request that is its leading run of such blocks."""
    starts, ends = log.chain_offsets[:-1], log.chain_offsets[1:]
    missing = np.flatnonzero(first_stored >= np.repeat(log.request_time, ends - starts))
    missing = np.append(missing, log.chain.size)  # past the last block: a request whose blocks all were
    first_missing = missing[np.searchsorted(missing, starts)]  # each request's first block not stored before it
    leading = np.minimum(first_missing, ends) - starts
    reach = np.minimum(leading * log.block_size, log.prompt)
    return float(np.maximum(np.minimum(reach, limit) - in_place, 0).sum())


def _restored(log: LogColumns) -> np.ndarray:
    """Which requests restored from RAM or disk."""
    return np.isin(log.tier, [TIER_CODES[ReuseTier.RAM], TIER_CODES[ReuseTier.DISK]])


def _with_earlier_stores(
    log: LogColumns, chain_first: np.ndarray, first_stores: _FirstStores
) -> tuple[LogColumns, np.ndarray]:
    """The log with stores, at its start, of what a request restored from RAM or disk though no store in
    the log put it there before: stored before the log began (a file rotated away, a cache filled before
    an upgrade, another machine's log). Sized at the log's median bytes per token (its median checkpoint).
    `chain_first`: when each chain block was first stored (every one, when any request restored); returned
    as it is in the new log."""
    restored = _restored(log)
    if not restored.any():
        return log, chain_first
    # The chain blocks a restore covered: the first reused // block_size of each restored request's chain.
    covered = np.where(restored & ~log.without_blocks, log.reused // np.maximum(log.block_size, 1), 0)
    covered = np.minimum(covered, np.diff(log.chain_offsets))
    block_request = np.repeat(np.arange(log.requests), covered)
    first_of = np.concatenate(([0], np.cumsum(covered)))[:-1]
    block_index = log.chain_offsets[block_request] + np.arange(block_request.size) - first_of[block_request]
    earlier = chain_first[block_index] >= log.request_time[block_request]  # not stored before it, in the log
    block_request, block_index = block_request[earlier], block_index[earlier]
    mark_request = np.repeat(np.arange(log.requests), np.diff(log.mark_offsets))
    marks = np.flatnonzero(restored[mark_request] & (log.mark_end == log.reused[mark_request]))
    marks = marks[first_stores.of(log.mark_key[marks]) >= log.request_time[mark_request[marks]]]
    if block_index.size == 0 and marks.size == 0:
        return log, chain_first
    keys = np.concatenate([log.chain[block_index], log.mark_key[marks]])
    owner = np.concatenate([block_request, mark_request[marks]])
    is_mark = np.concatenate([np.zeros(block_request.size, dtype=bool), np.ones(marks.size, dtype=bool)])
    tokens = np.concatenate(
        [log.block_size[block_request], log.mark_end[marks] % np.maximum(log.block_size[mark_request[marks]], 1)]
    )
    keys, first = np.unique(keys, return_index=True)  # once, for the first request that needed it
    owner, is_mark, tokens = owner[first], is_mark[first], tokens[first]
    block_entries = ~log.entry_checkpoint & (log.entry_tokens > 0)
    per_token = (
        float(np.median(log.entry_size[block_entries] / log.entry_tokens[block_entries]))
        if block_entries.any()
        else 0.0
    )
    checkpoint_size = float(np.median(log.entry_size[log.entry_checkpoint])) if log.entry_checkpoint.any() else 0.0
    checkpoint = is_mark & log.at_checkpoints[owner]
    sizes = np.where(checkpoint, checkpoint_size, tokens * per_token).astype(np.int64)
    if not (sizes > 0).any():
        return log, chain_first  # nothing in the log tells their size
    order = np.lexsort((np.arange(keys.size), owner))  # one store per request that needed them, in chain order
    keys, owner, sizes, tokens, checkpoint = keys[order], owner[order], sizes[order], tokens[order], checkpoint[order]
    _, per_store = np.unique(owner, return_counts=True)
    start = min(float(log.request_time.min()), float(log.store_time.min()) if log.store_time.size else np.inf) - 1.0
    chain_first = np.where(np.isin(log.chain, keys), start, chain_first)
    earlier_log = replace(
        log,
        store_time=np.concatenate([np.full(per_store.size, start), log.store_time]),
        store_session=np.concatenate([np.full(per_store.size, -1, dtype=np.int64), log.store_session]),
        entry_key=np.concatenate([keys, log.entry_key]),
        entry_size=np.concatenate([sizes, log.entry_size]),
        entry_tokens=np.concatenate([tokens, log.entry_tokens]),
        entry_parent=np.concatenate([np.zeros(keys.size, dtype=np.uint64), log.entry_parent]),
        entry_start=np.concatenate([np.zeros(keys.size, dtype=np.int64), log.entry_start]),
        entry_checkpoint=np.concatenate([checkpoint, log.entry_checkpoint]),
        entry_offsets=np.concatenate([_offsets(per_store), _offsets(per_store)[-1] + log.entry_offsets[1:]]),
    )
    return earlier_log, chain_first


class _FirstStores:
    """When each key was first stored in the log (inf: never): the entries sorted once, looked up by many."""

    def __init__(self, log: LogColumns) -> None:
        self._log = log
        self._table: tuple[np.ndarray, np.ndarray] | None = None

    def of(self, keys: np.ndarray) -> np.ndarray:
        times = np.full(keys.size, np.inf)
        stored_keys, stored_times = self._sorted()
        if stored_keys.size == 0 or keys.size == 0:
            return times
        found = np.minimum(np.searchsorted(stored_keys, keys), stored_keys.size - 1)
        known = stored_keys[found] == keys
        times[known] = stored_times[found[known]]
        return times

    def _sorted(self) -> tuple[np.ndarray, np.ndarray]:
        """Each stored key once, sorted, with its first store's time."""
        if self._table is None:
            log = self._log
            entry_time = log.store_time[np.repeat(np.arange(log.store_time.size), np.diff(log.entry_offsets))]
            order = np.lexsort((entry_time, log.entry_key))
            stored_keys, stored_times = log.entry_key[order], entry_time[order]
            first = np.ones(stored_keys.size, dtype=bool)
            first[1:] = stored_keys[1:] != stored_keys[:-1]
            self._table = stored_keys[first], stored_times[first]
        return self._table


def _offsets(counts: np.ndarray) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(counts))).astype(np.int64)


def _tier_distance(
    entries: _Blocks | _Checkpoints,
    ttl_s: float,
    ram_budget: float | None,
    tier: str,
    in_ram: np.ndarray | None = None,
) -> np.ndarray:
    """Each entry's distance for the question asked: in its process's RAM stack (tier "ram"), or in the
    disk stack, 0 where the RAM tier within `ram_budget` still keeps it (LRU's, or `in_ram` replayed);
    NEVER once expired."""
    if in_ram is None:
        kept_in_ram = (entries.ram < NEVER) & (entries.ram <= (ram_budget if ram_budget is not None else -1))
        in_ram = kept_in_ram & (entries.ram_age <= ttl_s)
    if tier == "ram":
        return np.where(entries.ram_age <= ttl_s, entries.ram, NEVER)
    return np.where(in_ram, 0, np.where(entries.age <= ttl_s, entries.disk, NEVER))


def _cost(start: int | np.ndarray, end: int | np.ndarray) -> np.ndarray:
    """Token-times to compute positions [start, end) (eviction.recompute_cost, vectorised)."""
    tokens = np.asarray(end, dtype=np.float64) - np.asarray(start, dtype=np.float64)
    return tokens * (1.0 + (np.asarray(start, dtype=np.float64) + (tokens - 1) / 2) / ATTENTION_TOKENS)


def _stored_bytes(log: LogColumns) -> int:
    """Bytes of the distinct entries the log saw stored (what an unlimited disk would hold, before TTL)."""
    keys, first = np.unique(log.entry_key, return_index=True)
    return int(log.entry_size[first].sum()) if keys.size else 0


def _prefix_max(values: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """The running maximum of `values` within each run of equal `segment` (sorted, non-decreasing)."""
    if values.size == 0:
        return values.astype(np.int64)
    levels, rank = np.unique(values, return_inverse=True)
    offset = segment.astype(np.int64) * (levels.size + 1)
    running = np.maximum.accumulate(rank.astype(np.int64) + offset) - offset
    return np.asarray(levels[running], dtype=np.int64)


def _envelope(
    request: np.ndarray, end: np.ndarray, distance: np.ndarray, in_place: np.ndarray, limit: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(distance, tokens, cost) gained by points (a request reuses up to `end` once the budget reaches
    `distance`): per request the reuse at budget B is max(in_place, min(limit, the largest end within B))."""
    if request.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0)
    order = np.lexsort((-end, distance, request))
    request, end, distance = request[order], end[order], distance[order]
    reach = np.maximum(np.minimum(end, limit[request]), in_place[request]).astype(np.int64)
    offset = request.astype(np.int64) << 32
    best = np.maximum.accumulate(reach + offset) - offset
    first = np.ones(request.size, dtype=bool)
    first[1:] = request[1:] != request[:-1]
    before = np.where(first, in_place[request], np.roll(best, 1))
    gained = best - before
    useful = (gained > 0) & (distance < NEVER)
    return distance[useful], gained[useful], _cost(before[useful], best[useful])


@dataclass(frozen=True)
class _Asked:
    """The keys of one kind a sampled log's requests ask for (chain blocks; or marks: checkpoints and blocks
    matched in part), one row each."""

    kept: np.ndarray  # indices into the log's column of these keys (log.chain, log.mark_key)
    request: np.ndarray
    end: np.ndarray  # the prompt position the key reaches
    id: np.ndarray
    wanted: np.ndarray  # queried within the request's limit
    touched: np.ndarray  # and not held in place: a use of the key

    @classmethod
    def of(
        cls,
        log: LogColumns,
        kept: np.ndarray,
        request: np.ndarray,
        end: np.ndarray,
        *,
        id: np.ndarray,
        wanted: np.ndarray,
    ) -> _Asked:
        return cls(kept, request, end, id, wanted, wanted & (end > log.in_place[request]))

    def used(self, first_store: np.ndarray, request_step: np.ndarray) -> np.ndarray:
        """Which rows are uses in the timeline: touched, and stored before their request."""
        used: np.ndarray = self.touched & (first_store[self.id] < request_step[self.request])
        return used


@dataclass(frozen=True)
class _Queries:
    """What the sampled log asks for: each request's chain blocks and checkpoints (marks), each store's
    entries, with dense ids of their keys (a key left out of the sample gets a valid id never used)."""

    keys: np.ndarray  # the kept keys, sorted: an id is an index here
    blocks: _Asked
    block_start: np.ndarray
    marks: _Asked
    entry_store: np.ndarray  # of each kept entry (log.entry_key), its store
    entry_checkpoint: np.ndarray
    entry_id: np.ndarray
    kept_entries: np.ndarray

    @classmethod
    def of(cls, log: LogColumns, rate: float) -> _Queries:
        chain_kept, mark_kept, entry_kept = (
            _sampled(column, rate) for column in (log.chain, log.mark_key, log.entry_key)
        )
        keys = np.unique(np.concatenate([log.entry_key[entry_kept], log.chain[chain_kept], log.mark_key[mark_kept]]))
        keys = keys if keys.size else np.zeros(1, dtype=np.uint64)  # ids below index something, even in an empty log

        def ids(values: np.ndarray) -> np.ndarray:
            return np.minimum(np.searchsorted(keys, values), keys.size - 1)

        # Only what the sample keeps is looked at from here on (a long log makes big arrays slow to allocate).
        kept_blocks = np.flatnonzero(chain_kept)
        block_request = np.searchsorted(log.chain_offsets, kept_blocks, side="right") - 1
        block_start = (kept_blocks - log.chain_offsets[block_request]) * log.block_size[block_request]
        block_end = np.minimum(block_start + log.block_size[block_request], log.prompt[block_request])
        limit = np.minimum(log.limit, log.prompt)
        kept_marks = np.flatnonzero(mark_kept)
        mark_request = np.searchsorted(log.mark_offsets, kept_marks, side="right") - 1
        mark_end = log.mark_end[kept_marks]
        mark_wanted = mark_end <= limit[mark_request]
        if rate < 1.0:
            # A sample's blocks are added up, scaled; a block matched in part (plain models) is the best of two
            # points, which a sum cannot scale: left out (less than a block per request).
            mark_wanted &= log.at_checkpoints[mark_request]
        kept_entries = np.flatnonzero(entry_kept)
        blocks = _Asked.of(
            log,
            kept_blocks,
            block_request,
            block_end,
            id=ids(log.chain[kept_blocks]),
            wanted=block_start < limit[block_request],
        )
        marks = _Asked.of(log, kept_marks, mark_request, mark_end, id=ids(log.mark_key[kept_marks]), wanted=mark_wanted)
        return cls(
            keys=keys,
            blocks=blocks,
            block_start=block_start,
            marks=marks,
            entry_store=np.searchsorted(log.entry_offsets, kept_entries, side="right") - 1,
            entry_checkpoint=log.entry_checkpoint[kept_entries],
            entry_id=ids(log.entry_key[kept_entries]),
            kept_entries=kept_entries,
        )


@dataclass(frozen=True)
class _Timeline:
    """Every use of a kept key as a step in time, and the stacks a request's queries are measured in.

    Time is counted in steps: a store's blocks are one step (used deepest first), each checkpoint it
    stores a step before them; a request's queries come before its own steps, one per checkpoint it
    uses (deepest first), then one for its blocks. Within a step only a block's ancestors come after
    it (`_add_ancestors`).
    """

    use_step: np.ndarray
    use_key: np.ndarray
    use_size: np.ndarray
    sizes: np.ndarray  # bytes of each key
    step_count: int
    step_time: np.ndarray
    step_session: np.ndarray
    request_step: np.ndarray
    request_session: np.ndarray
    request_time: np.ndarray
    by_session: np.ndarray  # steps ordered process by process (the RAM stacks)
    session_rank: np.ndarray
    one_process: bool  # every step and request in one process: one stack for both tiers

    @classmethod
    def of(cls, log: LogColumns, queries: _Queries) -> _Timeline:
        q = queries
        requests, stores = log.requests, log.store_time.size
        # Events (requests and stores) in time order, a store after a request of the same moment.
        times = np.concatenate([log.request_time, log.store_time])
        is_store = np.concatenate([np.zeros(requests, dtype=bool), np.ones(stores, dtype=bool)])
        order = np.lexsort((is_store, times))
        row = np.concatenate([np.arange(requests), np.arange(stores)])[order]
        store_event = is_store[order]
        # Steps per event, and where each event's first step is.
        store_marks = np.bincount(q.entry_store, weights=q.entry_checkpoint, minlength=stores).astype(np.int64)
        request_marks = np.bincount(q.marks.request[q.marks.touched], minlength=requests).astype(np.int64)
        steps_of = np.ones(order.size, dtype=np.int64)
        steps_of[store_event] += store_marks[row[store_event]]
        steps_of[~store_event] += request_marks[row[~store_event]]
        first_step = np.concatenate(([0], np.cumsum(steps_of)))[:-1]
        step_count = int(steps_of.sum())
        request_step = np.zeros(requests, dtype=np.int64)
        request_step[row[~store_event]] = first_step[~store_event]
        store_step = np.zeros(stores, dtype=np.int64)
        store_step[row[store_event]] = first_step[store_event]
        event_of_step = np.repeat(np.arange(order.size), steps_of)
        # Sessions renumbered densely: the combined keys below multiply them, and a log's ids are random 32-bit.
        _, dense_session = np.unique(np.concatenate([log.request_session, log.store_session]), return_inverse=True)
        dense_session = dense_session.ravel().astype(np.int64)
        step_session = dense_session[order][event_of_step]
        # Uses: a store's checkpoints one step each (deepest, i.e. last stored, first), then its blocks.
        mark_rank = _rank_from_end(q.entry_checkpoint, q.entry_store)
        entry_step = store_step[q.entry_store] + np.where(q.entry_checkpoint, mark_rank, store_marks[q.entry_store])
        sizes = np.zeros(q.keys.size, dtype=np.int64)
        sizes[q.entry_id] = log.entry_size[q.kept_entries]
        first_store = np.full(q.keys.size, step_count, dtype=np.int64)
        np.minimum.at(first_store, q.entry_id, entry_step)
        # A request's checkpoints one step each (deepest first), then its blocks; only what was stored before it.
        touched_step = request_step[q.marks.request] + _rank_by_end(q.marks.end, q.marks.request, q.marks.touched)
        block_step = request_step[q.blocks.request] + request_marks[q.blocks.request]
        mark_use = q.marks.used(first_store, request_step)
        block_use = q.blocks.used(first_store, request_step)
        use_key = np.concatenate([q.entry_id, q.marks.id[mark_use], q.blocks.id[block_use]])
        by_session = np.lexsort((np.arange(step_count), step_session))
        session_rank = np.empty(step_count, dtype=np.int64)
        session_rank[by_session] = np.arange(step_count)
        return cls(
            use_step=np.concatenate([entry_step, touched_step[mark_use], block_step[block_use]]),
            use_key=use_key,
            use_size=sizes[use_key],
            sizes=sizes,
            step_count=step_count,
            step_time=times[order][event_of_step],
            step_session=step_session,
            request_step=request_step,
            request_session=dense_session[:requests],
            request_time=log.request_time,
            by_session=by_session,
            session_rank=session_rank,
            one_process=bool(np.all(dense_session == 0)),
        )

    def distances(self, request: np.ndarray, key_of: np.ndarray) -> tuple[np.ndarray, ...]:
        """(disk distance, RAM distance, age, RAM age, last step, last RAM step), ancestors not yet added."""
        step_of, session_of, size_of = self.request_step[request], self.request_session[request], self.sizes[key_of]
        disk, last = _stack_distances(
            self.use_step, self.use_key, self.use_size, self.step_count, step_of, key_of, size_of
        )
        now = self.request_time[request]
        age = np.where(last >= 0, now - self.step_time[np.maximum(last, 0)], np.inf)
        if self.one_process:  # (a long-running server's log): its RAM stack is the disk's
            return disk, disk, age, age, last, last
        # Keys told apart by process, renumbered densely (their products with steps must fit in 64 bits).
        stride = self.sizes.size + 1
        ram_keys = np.concatenate(
            [self.step_session[self.use_step] * stride + self.use_key, session_of * stride + key_of]
        )
        _, ram_ids = np.unique(ram_keys, return_inverse=True)
        ram_ids = ram_ids.ravel().astype(np.int64)
        ram, ram_last = _stack_distances(
            self.session_rank[self.use_step],
            ram_ids[: self.use_key.size],
            self.use_size,
            self.step_count,
            _rank_before(self.step_session, step_of, session_of),
            ram_ids[self.use_key.size :],
            size_of,
        )
        ram_age = np.where(ram_last >= 0, now - self.step_time[self.by_session[np.maximum(ram_last, 0)]], np.inf)
        return disk, ram, age, ram_age, last, ram_last


def _measure(log: LogColumns, rate: float) -> tuple[_Blocks, _Checkpoints]:
    """Stack distances of every block (and checkpoint) a request could reuse, in the disk and RAM stacks
    (`_Timeline` says how time is counted)."""
    q = _Queries.of(log, rate)
    timeline = _Timeline.of(log, q)
    blocks_wanted = q.blocks.wanted
    wanted_request = q.blocks.request[blocks_wanted]
    block_size_of = timeline.sizes[q.blocks.id[blocks_wanted]]
    disk, ram, age, ram_age, last, ram_last = timeline.distances(wanted_request, q.blocks.id[blocks_wanted])
    blocks = _Blocks(
        wanted_request,
        q.block_start[blocks_wanted],
        q.blocks.end[blocks_wanted],
        _add_ancestors(disk, last, wanted_request, block_size_of),
        _add_ancestors(ram, ram_last, wanted_request, block_size_of),
        age,
        ram_age,
        log.chain[q.blocks.kept][blocks_wanted],
    )
    marks_wanted = q.marks.wanted
    wanted_mark = q.marks.request[marks_wanted]
    anchor = q.marks.end[marks_wanted] // np.maximum(log.block_size[wanted_mark], 1) * log.block_size[wanted_mark]
    mark_disk, mark_ram, mark_age, mark_ram_age, mark_last, mark_ram_last = timeline.distances(
        wanted_mark, q.marks.id[marks_wanted]
    )
    # A mark last used as a block of a store (a block a later prompt matched in part) has that store's
    # blocks before it above it in the stack: the chain's blocks before its anchor last used there.
    chain = (wanted_request, blocks.end, block_size_of)
    mark_disk = _add_stored_with(mark_disk, mark_last, wanted_mark, anchor, *chain, last)
    mark_ram = _add_stored_with(mark_ram, mark_ram_last, wanted_mark, anchor, *chain, ram_last)
    marks = _Checkpoints(
        wanted_mark,
        q.marks.end[marks_wanted],
        mark_disk,
        mark_ram,
        mark_age,
        mark_ram_age,
        anchor,
        log.mark_key[q.marks.kept][marks_wanted],
    )
    return blocks, marks


def _add_stored_with(
    distance: np.ndarray,
    last: np.ndarray,
    request: np.ndarray,
    anchor: np.ndarray,
    block_request: np.ndarray,
    block_end: np.ndarray,
    block_size: np.ndarray,
    block_last: np.ndarray,
) -> np.ndarray:
    """Add to each mark's distance the sizes of its request's chain blocks ending by its anchor whose last
    use was the mark's own last step (they came after it there)."""
    if distance.size == 0 or block_request.size == 0:
        return distance
    steps = int(max(block_last.max(), last.max())) + 2
    groups, block_group = np.unique(block_request.astype(np.int64) * steps + block_last + 1, return_inverse=True)
    span = int(max(block_end.max(), anchor.max())) + 1
    order = np.lexsort((block_end, block_group.ravel()))
    keys = block_group.ravel()[order].astype(np.int64) * span + block_end[order]
    running = np.concatenate(([0], np.cumsum(block_size[order])))
    mark_group = np.searchsorted(groups, request.astype(np.int64) * steps + last + 1)
    known = (mark_group < groups.size) & (last >= 0)
    known[known] = groups[mark_group[known]] == request[known].astype(np.int64) * steps + last[known] + 1
    group_start = np.searchsorted(keys, mark_group.astype(np.int64) * span, side="left")
    upto = np.searchsorted(keys, mark_group.astype(np.int64) * span + anchor, side="right")
    extra = np.where(known, running[upto] - running[group_start], 0)
    return np.where((distance < NEVER) & known, distance + extra, distance)


def _sampled(keys: np.ndarray, rate: float) -> np.ndarray:
    """Which keys a sample at `rate` keeps: by a mix of the key's own bits (splitmix64), so a key is
    in or out for the whole log. In place, a chunk at a time: a long log's temporaries cost more than the math."""
    if rate >= 1.0:
        return np.ones(keys.size, dtype=bool)
    kept = np.empty(keys.size, dtype=bool)
    chunk = 1 << 18
    mixed = np.empty(min(chunk, keys.size), dtype=np.uint64)
    shifted = np.empty_like(mixed)
    threshold = np.uint64(rate * 2.0**64)
    with np.errstate(over="ignore"):
        for start in range(0, keys.size, chunk):
            part = keys[start : start + chunk]
            value, spare = mixed[: part.size], shifted[: part.size]
            np.add(part.astype(np.uint64, copy=False), np.uint64(0x9E3779B97F4A7C15), out=value)
            for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
                np.right_shift(value, np.uint64(shift), out=spare)
                np.bitwise_xor(value, spare, out=value)
                np.multiply(value, np.uint64(factor), out=value)
            np.right_shift(value, np.uint64(31), out=spare)
            np.bitwise_xor(value, spare, out=value)
            np.less(value, threshold, out=kept[start : start + part.size])
    return kept


def _rank_from_end(flags: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """For each flagged item: how many flagged items come after it in its segment (0 for the last)."""
    flagged = flags.astype(np.int64)
    total = np.bincount(segment, weights=flagged, minlength=int(segment.max()) + 1 if segment.size else 0)
    before = np.cumsum(flagged) - flagged
    segment_start = np.concatenate(([0], np.cumsum(total)))[:-1].astype(np.int64)
    seen = before - segment_start[segment] if segment.size else before
    return np.asarray(total[segment] - seen - 1 if segment.size else seen, dtype=np.int64)


def _rank_by_end(ends: np.ndarray, segment: np.ndarray, flags: np.ndarray) -> np.ndarray:
    """For each flagged item: its rank among its segment's flagged items, deepest (largest end) first."""
    rank = np.zeros(ends.size, dtype=np.int64)
    picked = np.flatnonzero(flags)
    if picked.size == 0:
        return rank
    order = picked[np.lexsort((-picked, -ends[picked], segment[picked]))]
    first = np.ones(order.size, dtype=bool)
    first[1:] = segment[order][1:] != segment[order][:-1]
    index = np.arange(order.size)
    rank[order] = index - np.maximum.accumulate(np.where(first, index, 0))
    return rank


def _rank_before(sessions: np.ndarray, step: np.ndarray, session: np.ndarray) -> np.ndarray:
    """Where a query made at `step` by `session` falls in the process-by-process order of steps: at that
    process's first step at or after `step` (queries come before a step's uses)."""
    stride = sessions.size + 1
    ordered = np.sort(sessions.astype(np.int64) * stride + np.arange(sessions.size))
    return np.asarray(np.searchsorted(ordered, session.astype(np.int64) * stride + step, side="left"), dtype=np.int64)


def _stack_distances(
    use_event: np.ndarray,
    use_key: np.ndarray,
    use_size: np.ndarray,
    events: int,
    query_event: np.ndarray,
    query_key: np.ndarray,
    query_size: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """For each query (a key asked for at an event, before that event's own uses): the bytes of the distinct
    keys used since the key's last use, in events after it, plus its own size; and that last use's event
    (-1, and distance NEVER, for a key not used before). Uses from the last use's own event that came after
    it (its ancestors) are the caller's (`_add_ancestors`)."""
    distance = np.full(query_event.size, NEVER, dtype=np.int64)
    last = np.full(query_event.size, -1, dtype=np.int64)
    if use_event.size == 0 or query_event.size == 0:
        return distance, last
    stride = events + 1
    by_key = np.lexsort((use_event, use_key))  # a key is used at most once a step
    keys, when, sizes = use_key[by_key], use_event[by_key], use_size[by_key]
    following = np.full(keys.size, events, dtype=np.int64)  # the event of the same key's next use (events: none)
    same = keys[1:] == keys[:-1]
    following[:-1][same] = when[1:][same]
    # Uses grouped by (event, next use's event): the unit the counts are made of.
    groups, group_of = np.unique(when * stride + following, return_inverse=True)
    weight = np.bincount(group_of.ravel(), weights=sizes, minlength=groups.size).astype(np.int64)
    group_event, group_next = groups // stride, groups % stride
    # Each query's last use before its event.
    ordered = keys.astype(np.int64) * stride + when
    probe = query_key.astype(np.int64) * stride + query_event
    found = np.searchsorted(ordered, probe, side="left") - 1
    valid = found >= 0
    valid[valid] = keys[found[valid]] == query_key[valid]
    last[valid] = when[found[valid]]
    # Bytes of the groups between the last use and the query that are not used again before it.
    pairs, pair_of = np.unique(last[valid] * stride + query_event[valid], return_inverse=True)
    since, until = pairs // stride, pairs % stride
    by_event = np.argsort(group_event, kind="stable")
    running_event = np.concatenate(([0], np.cumsum(weight[by_event])))
    by_next = np.argsort(group_next, kind="stable")
    running_next = np.concatenate(([0], np.cumsum(weight[by_next])))
    up_to_until = running_event[np.searchsorted(group_event[by_event], until - 1, side="right")]
    up_to_since = running_event[np.searchsorted(group_event[by_event], since, side="right")]
    ended_before = running_next[np.searchsorted(group_next[by_next], until, side="left")]
    ended_inside_before = dominance_sums(group_event, group_next, weight, since, until)
    between = (up_to_until - up_to_since) - (ended_before - ended_inside_before)
    distance[valid] = between[pair_of.ravel()] + query_size[valid]
    return distance, last


def _add_ancestors(distance: np.ndarray, last: np.ndarray, request: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Add, to each chain block's distance, its ancestors last used in the same event as it: used after it
    there (deepest first), so above it in the stack. Blocks come in request and chain order."""
    if distance.size == 0:
        return distance
    order = np.lexsort((np.arange(distance.size), last, request))
    grouped = np.stack([request[order], last[order]])
    start = np.ones(distance.size, dtype=bool)
    start[1:] = np.any(grouped[:, 1:] != grouped[:, :-1], axis=0)
    running = np.cumsum(size[order]) - size[order]
    base = np.maximum.accumulate(np.where(start, running, 0))
    ancestors = np.empty(distance.size, dtype=np.int64)
    ancestors[order] = running - base
    return np.where((distance < NEVER) & (last >= 0), distance + ancestors, distance)
