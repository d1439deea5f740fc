"""Replay a request trace against a RAM budget under an eviction policy: token hit rate and compute time.

The replay does what the prefix cache does with one tier: a request reuses its chain's blocks up to
the first one not kept (a block is found only after its parents), computes the rest and keeps
every block it computed, evicting the policy's victims while over budget; a block unused for the
TTL expires (sliding, as in the tiers). The online policies are cache/eviction.py's own classes.

Compute time: a token at position p costs PER_TOKEN_MS x (1 + p / k), k = `ATTENTION_TOKENS`
(`recompute_cost`), so missing a deep block costs more than missing a shallow one.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cache.eviction import BlockPlace, EvictionPolicy, LazyHeap, recompute_cost
from cache.keys import BlockKey
from cache.request_log import LoggedEvent, LoggedRequest, LoggedStore
from cache.tiers import ReuseTier
from chatapp.benchmark.traces import ROOT, Trace

PER_TOKEN_MS = 1.0  # a token at the start of a prompt (about a 1B model's prefill on a laptop CPU)
BYTES_PER_TOKEN = 1  # sizes in tokens: every block weighs the same, so only the budget's share matters


def block_key(block: int) -> BlockKey:
    return BlockKey(block.to_bytes(16, "little", signed=True))


class BeladyPolicy:
    """Belady's offline choice: evict the block whose next use is furthest in the future.

    With blocks of one size and no tree this is the optimum (the most hits any policy can get
    from the same cache); with a tree it stays the classic furthest-next-use heuristic: a
    parent's next use is never after its children's, and at a tie the deeper block goes first,
    so it never strands a child. A block whose next use comes after its TTL would run out
    counts as never used again. It needs the future: `next_use(key, now)`, the time of the
    key's next use after `now` (inf for none).
    """

    name = "belady"

    def __init__(self, next_use: Callable[[BlockKey, float], float], ttl_s: float) -> None:
        self._next_use = next_use
        self._ttl_s = ttl_s
        self._starts: dict[BlockKey, int] = {}
        self._pinned: set[BlockKey] = set()
        self._heap = LazyHeap()

    def admit(self, key: BlockKey, place: BlockPlace, size: int, now: float, pinned: bool = False) -> None:
        self._starts[key] = place.start
        if pinned:
            self._pinned.add(key)
        self.touch(key, now)

    def touch(self, key: BlockKey, now: float) -> None:
        if key not in self._starts or key in self._pinned:
            return
        upcoming = self._next_use(key, now)
        if upcoming - now > self._ttl_s:
            upcoming = math.inf
        self._heap.push(key, -upcoming, -self._starts[key])

    def forget(self, key: BlockKey) -> None:
        self._starts.pop(key, None)
        self._pinned.discard(key)
        self._heap.discard(key)

    def set_pinned(self, key: BlockKey, pinned: bool) -> None:
        if pinned:
            self._pinned.add(key)
            self._heap.discard(key)

    def victim(self) -> BlockKey | None:
        return self._heap.peek()

    def clear(self) -> None:
        self._starts.clear()
        self._pinned.clear()
        self._heap.clear()


def next_use_table(trace: Trace) -> Callable[[BlockKey, float], float]:
    """For Belady: each block's use times, searched for the first after a moment."""
    uses: dict[BlockKey, list[float]] = {}
    for when, chain in zip(trace.times, trace.chains, strict=True):
        for block in chain:
            uses.setdefault(block_key(block), []).append(when)

    def next_use(key: BlockKey, now: float) -> float:
        times = uses.get(key, [])
        index = bisect.bisect_right(times, now)
        return times[index] if index < len(times) else math.inf

    return next_use


@dataclass(frozen=True)
class ReplayResult:
    policy: str
    prompt_tokens: int
    reused_tokens: int
    computed_tokens: int
    compute_s: float  # the computed tokens under the cost model
    no_cache_compute_s: float  # every prompt computed in full
    evictions: int
    expirations: int

    @property
    def hit_rate(self) -> float:
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def replay(
    trace: Trace, policy: EvictionPolicy, budget_bytes: int, ttl_s: float, log: list[LoggedEvent] | None = None
) -> ReplayResult:
    """Run every request of `trace` through one RAM tier of `budget_bytes` evicting by `policy`.

    As the tiers do, the reused prefix is read deepest first, then the computed blocks stored deepest
    first. With `log`, each request and store is appended as the cache's request log records it (one
    byte per token), for sizing advice (cache/sizing.py) to be checked against the replay.
    """
    tokens = trace.block_tokens
    size = tokens * BYTES_PER_TOKEN
    keys = [block_key(block) for block in range(trace.blocks)]
    places = [
        BlockPlace(None if parent == ROOT else keys[parent], start, tokens)
        for parent, start in zip(trace.parents, trace.starts, strict=True)
    ]
    costs = [recompute_cost(start, tokens) * PER_TOKEN_MS / 1000 for start in trace.starts]
    expires: dict[int, float] = {}  # kept block -> when it expires
    expiry: list[tuple[float, int]] = []  # (expires, block), stale entries skipped
    block_of = {key: block for block, key in enumerate(keys)}
    used = reused = evictions = expirations = 0
    compute_s = no_cache_s = 0.0

    def drop(block: int) -> None:
        nonlocal used
        del expires[block]
        policy.forget(keys[block])
        used -= size

    for now, chain in zip(trace.times, trace.chains, strict=True):
        while expiry and expiry[0][0] <= now:
            when, block = heapq.heappop(expiry)
            if expires.get(block) == when:
                drop(block)
                expirations += 1
        found = 0
        while found < len(chain) and chain[found] in expires:
            found += 1
        reused += found * tokens
        no_cache_s += sum(costs[block] for block in chain)
        new = [block for block in chain[found:] if block not in expires]
        if log is not None:
            log.append(_logged_request(now, chain, tokens, found))
        # The restore reads the reused prefix, deepest first; then the store keeps what was computed, deepest
        # first (as the tiers do: the blocks stored last are the most recent).
        for block in reversed(chain[:found]):
            policy.touch(keys[block], now)
            expires[block] = now + ttl_s
            heapq.heappush(expiry, (now + ttl_s, block))
        compute_s += sum(costs[block] for block in chain[found:])
        for block in reversed(new):  # a block still kept past the first miss is neither stored again nor used
            used += size
            policy.admit(keys[block], places[block], size, now)
            expires[block] = now + ttl_s
            heapq.heappush(expiry, (now + ttl_s, block))
            while used > budget_bytes:
                victim = policy.victim()
                if victim is None:
                    break
                drop(block_of[victim])
                evictions += 1
        if log is not None and new:
            log.append(_logged_store(now, new, tokens))
        if len(expiry) > 4 * len(expires) + 1024:
            expiry = [(when, block) for block, when in expires.items()]
            heapq.heapify(expiry)
    prompt = trace.prompt_tokens
    return ReplayResult(policy.name, prompt, reused, prompt - reused, compute_s, no_cache_s, evictions, expirations)


def _short_keys(blocks: list[int]) -> np.ndarray:
    """A trace's block ids as the log's keys (0 is the root)."""
    return np.array(blocks, dtype=np.uint64) + np.uint64(1)


def _logged_request(now: float, chain: list[int], tokens: int, found: int) -> LoggedRequest:
    prompt = len(chain) * tokens
    tier = ReuseTier.RAM if found else ReuseTier.NONE
    return LoggedRequest(
        now, 1, prompt, prompt, 0, found * tokens, tier, False, tokens, 0.0, _short_keys(chain),
        np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.uint32),
    )  # fmt: skip


def _logged_store(now: float, blocks: list[int], tokens: int) -> LoggedStore:
    count = len(blocks)
    return LoggedStore(
        now, 1, _short_keys(blocks), np.zeros(count, dtype=np.uint64), np.zeros(count, dtype=np.uint32),
        np.full(count, tokens, dtype=np.uint32), np.full(count, tokens * BYTES_PER_TOKEN, dtype=np.uint64),
        np.zeros(count, dtype=bool),
    )  # fmt: skip
