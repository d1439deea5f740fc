"""The prefix cache: find the longest restorable prefix of a prompt, fetch it, store new state.

Blocks of full-attention KV and checkpoints (a model's uncuttable sections at one position:
its sliding window, its recurrent state) live in RAM (evicted by value or LRU, TTL) and on
disk (diskcache, LRU, TTL), found through one in-memory index. A prefix is restorable where its blocks are
stored and, for a model with uncuttable sections, a checkpoint sits exactly at its end.
Storing runs on a background thread: the caller hands over a copy of a sequence's state and
returns at once; slicing it into blocks, hashing, and writing through to disk never hold up
the token stream. Thread-safe.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from cache.blocks import BlockInfo
from cache.disk_tier import DiskTier
from cache.entries import Entries
from cache.eviction import POLICY_NAMES, make_policy
from cache.index import BlockIndex
from cache.keys import as_token_array
from cache.maintenance import add_totals, remember_memory
from cache.namespace import Namespace
from cache.pins import Pins
from cache.ram_tier import RamTier
from cache.request_log import DEFAULT_MAX_BYTES
from cache.request_recorder import RequestRecorder
from cache.restore_checks import RestoreChecks
from cache.state_assembly import StateAssembly, StateBuffer
from cache.state_format import MemoryLayout, StateFormatError
from cache.stats import CacheStats
from cache.store_writer import StoreWriter
from cache.tier import Payload, Tier
from cache.tier_chain import TierChain
from cache.tiers import ReuseTier

log = logging.getLogger(__name__)

GIB = 1 << 30
DAY = 24 * 3600.0


STOPPED_NOTICE = (
    "a restore check found an answer that reused the cache unlike a cold run: every prompt of this model is now "
    "computed in full; `chatapp cache verify` checks again, `chatapp cache verify --clear` resumes reuse"
)


@dataclass(frozen=True)
class CacheConfig:
    """Sizes and lifetimes; the defaults suit a laptop."""

    block_size: int = 64
    ram_budget_bytes: int = 2 * GIB
    disk_budget_bytes: int = 10 * GIB
    ttl_seconds: float = 7 * DAY
    # A checkpoint fewer tokens than this after a stored one on the same tokens is not stored:
    # restoring that one and computing the few tokens between costs less than another window
    # or recurrent state (an answer's end, then the next turn's history end two template
    # tokens on). At most the engine's restore margin, so reuse stays within it.
    checkpoint_min_gap: int = 8
    # How the RAM tier chooses what to evict (cache/eviction.py): "value" (recompute cost x recent
    # uses per byte, leaves of the prefix tree first), "lru" or "lfu". The disk tier stays LRU.
    eviction_policy: str = "value"
    # The request log `chatapp cache advise` sizes the tiers from (cache/request_log.py); 0 keeps none.
    request_log_bytes: int = DEFAULT_MAX_BYTES
    # One prompt in this many that reused KV is computed again without it in idle time and its logits
    # compared bit for bit (cache/restore_checks.py); 0 checks none.
    check_every: int = 0

    def __post_init__(self) -> None:
        if self.eviction_policy not in POLICY_NAMES:
            raise ValueError(f"eviction_policy {self.eviction_policy!r}: choose one of {', '.join(POLICY_NAMES)}")


@dataclass(frozen=True)
class CachedPrefix:
    """What a lookup found: the longest prefix of the prompt the cache can restore.

    `blocks` cover positions [0, tokens) (the last may reach further: it is trimmed at
    assembly); `checkpoint` sits at exactly `tokens` (None for models that need none).
    """

    tokens: int
    blocks: tuple[BlockInfo, ...]
    checkpoint: BlockInfo | None


@dataclass(frozen=True)
class FetchedPrefix:
    """A cached prefix as a state llama.cpp loads, its length, and the slowest tier it came from."""

    blocks: tuple[BlockInfo, ...]
    state: np.ndarray  # in the caller's buffer when it gave one
    tokens: int
    checkpoint: bytes | None
    tier: ReuseTier
    prompt_tokens: tuple[int, ...]  # the prefix itself


@dataclass(frozen=True)
class _Filled:
    """What one pass of a fetch made: the state (None when a block was lost on the way, the blocks before it
    `usable`), the slowest tier it read, the blocks the first tier (RAM) served, and the prefix's tokens."""

    state: np.ndarray | None
    usable: int
    slowest: int  # the number of the slowest tier read
    served_by_first: list[BlockInfo]
    tokens: int


class PrefixCache:
    """The cache's one door: lookup, fetch and store, over the tiers (`TierChain`), the writer (`StoreWriter`),
    the pins (`Pins`) and the request recorder, which share the index (`Entries`)."""

    def __init__(
        self,
        directory: Path,
        namespace: Namespace,
        layout: MemoryLayout,
        config: CacheConfig = CacheConfig(),
        *,
        more_tiers: Sequence[Tier] = (),
    ) -> None:
        """`more_tiers`: kept after RAM and disk, slowest last (a shared store, say): written through, read
        where the faster ones miss."""
        self.namespace = namespace
        self.layout = layout
        self.config = config
        self.index = BlockIndex(config.block_size, namespace.seed)
        self.ram = RamTier(config.ram_budget_bytes, config.ttl_seconds, policy=make_policy(config.eviction_policy))
        self.disk = DiskTier(directory, config.disk_budget_bytes, config.ttl_seconds, bytes.fromhex(namespace.id))
        self.tiers = TierChain([self.ram, self.disk, *more_tiers])
        self.recorder = RequestRecorder(
            directory, layout, config.block_size, namespace.seed, config.request_log_bytes, enabled=self.disk.enabled
        )
        self.checks = RestoreChecks(directory, namespace.id, every=config.check_every, enabled=self.disk.enabled)
        self.entries = Entries(self.index, self.tiers, self.recorder, layout)
        self._told: set[str] = set()
        self.entries.learn_new()  # every live entry on disk: the index at start-up
        try:
            k_type = layout.kv_ggml_types[0]  # the KV cells' type, for `cache stats` (-1: none)
            remember_memory(directory, {"kind": layout.kind.value, "window": layout.window, "k_type": k_type})
        except OSError as error:  # a figure for `cache stats`; the disk tier says what is wrong
            log.warning("could not note the model's memory kind: %s", error)
        self.writer = StoreWriter(
            self.entries, layout, config.block_size, config.checkpoint_min_gap, config.ram_budget_bytes
        )
        self.pace = self.writer.pace  # the engine tells it when the model computes
        self.pins = Pins(self.entries, self._read_by)

    # Lookup and restore (engine thread).
    def lookup(self, prompt: np.ndarray, limit: int | None = None) -> CachedPrefix:
        """The longest prefix of `prompt`, at most `limit` tokens, the cache can restore."""
        array = as_token_array(prompt)
        limit = int(array.size) if limit is None else min(limit, int(array.size))
        memory = self.layout.memory
        self.entries.learn_new()  # what other processes (or our writer) stored meanwhile
        with self.entries.lock:
            match = self.index.longest_prefix(array) if memory.has_blocks else None
            covered = min(match.matched_tokens, limit) if match is not None else limit
            if not memory.restores_at_checkpoints:
                assert match is not None
                return CachedPrefix(covered, match.blocks, None)
        checkpoint = self.entries.deepest_restorable(array, covered)
        if checkpoint is None:
            return CachedPrefix(0, (), None)
        end = checkpoint.end
        blocks = tuple(block for block in match.blocks if block.start < end) if match is not None else ()
        return CachedPrefix(end, blocks, checkpoint)

    def fetch(
        self,
        found: CachedPrefix,
        prompt: np.ndarray,
        dest_seq: int = 0,
        *,
        buffer: StateBuffer | None = None,
        window_ring: int = 0,
        keep_blocks: bool = True,
    ) -> FetchedPrefix | None:
        """A lookup's prefix as a state for `dest_seq` (see StateAssembly), from the fastest tier that has each entry.

        Blocks read from a slower tier go straight into the state, each through memory of one block's size:
        kept by RAM when `keep_blocks` (no copy) as far as its budget goes, else the reading thread's scratch
        (a caller that keeps the whole state instead). A missing or damaged block shortens a plain model's prefix to
        the blocks before it; a model that needs its checkpoint gets nothing unless every block and
        the checkpoint are there.
        """
        if found.tokens == 0:
            return None
        slowest = 0
        served_by_first: list[BlockInfo] = []
        checkpoint: bytes | None = None
        if found.checkpoint is not None:
            got = self.entries.checkpoint_of(found.checkpoint)
            if got is None:
                return None
            checkpoint, slowest, from_first = got
            served_by_first.extend(from_first)
        memory = self.layout.memory
        blocks = list(found.blocks)
        while True:
            try:
                filled = self._fill(blocks, found, checkpoint, dest_seq, buffer, window_ring, keep_blocks)
            except StateFormatError as error:
                log.warning("cannot assemble a cached prefix: %s", error)
                return None
            if filled is None:
                return None
            slowest = max(slowest, filled.slowest)
            if filled.state is not None:
                break
            if memory.restores_at_checkpoints or filled.usable == 0:
                return None
            blocks = blocks[: filled.usable]  # again up to the block that was lost (rare: RAM keeps those read)
        served_by_first.extend(filled.served_by_first)
        if served_by_first:
            # The slower tiers' copies are used too (one recency over all tiers): refreshed on the writer thread.
            self.writer.later(partial(self.tiers.touch_after, 0, served_by_first))
        prefix = tuple(int(token) for token in as_token_array(prompt)[: filled.tokens])
        return FetchedPrefix(
            tuple(blocks), filled.state, filled.tokens, checkpoint, self.tiers.tiers[slowest].name, prefix
        )

    def _fill(
        self,
        blocks: list[BlockInfo],
        found: CachedPrefix,
        checkpoint: bytes | None,
        dest_seq: int,
        buffer: StateBuffer | None,
        window_ring: int,
        keep_blocks: bool,
    ) -> _Filled | None:
        """The state of `blocks` (and the checkpoint); None for a model with blocks and none of them.

        The first tier's blocks are marked used deepest first and the slower tiers' shallowest first (kept
        longest), then RAM keeps the ones read from the slower tiers too, deepest first: the tiers' LRU must
        evict a prefix's last block before its first (a block without its parents cannot be restored)."""
        memory = self.layout.memory
        if memory.has_blocks and not blocks:
            return None
        tokens = min(found.tokens, blocks[-1].end) if blocks and not memory.restores_at_checkpoints else found.tokens
        assembly = StateAssembly(
            self.layout,
            [int(info.tokens.size) for info in blocks],
            dest_seq,
            cells=tokens,
            checkpoint=checkpoint,
            buffer=buffer,
            window_ring=window_ring,
        )
        wanted = blocks[: assembly.pieces]
        keep = self.ram.would_keep(wanted) if keep_blocks else [False] * len(wanted)
        kept: dict[int, bytes | np.ndarray] = {}

        def sink(number: int, payload: Payload, tier: int) -> None:
            assembly.fill(number, payload)
            if tier and keep[number] and not isinstance(payload, memoryview):  # new memory, or a row's own bytes
                kept[number] = payload

        served = self.tiers.read_into(wanted, sink, keep=keep)
        lost = [number for number, by in enumerate(served) if by is None]
        for number in lost:
            self.entries.forget(wanted[number])
        usable = min(lost, default=len(blocks))
        for number in reversed(range(min(usable, assembly.pieces))):
            if number in kept:
                self.entries.keep_read(wanted[number], kept[number])
            elif served[number] == 0:
                self.tiers.first.touch([wanted[number]])
        if lost:  # asked of every tier
            return _Filled(None, usable, len(self.tiers.tiers) - 1, [], tokens)
        slowest = max((by for by in served if by is not None), default=0)
        first = [wanted[number] for number, by in enumerate(served) if by == 0]
        return _Filled(assembly.finish(), usable, slowest, first, tokens)

    def slowest_tier(self, found: CachedPrefix) -> ReuseTier:
        """Where a fetch of `found` would read from: the first tier (RAM) when it has every entry, else the next."""
        wanted = [*found.blocks, *((found.checkpoint,) if found.checkpoint is not None else ())]
        return self.tiers.tiers[0 if len(self.tiers.first.holding(wanted)) == len(wanted) else 1].name

    def _read_by(self, prompt: np.ndarray) -> list[BlockInfo]:
        """The entries a restore of `prompt`'s longest cached prefix reads, in order: its blocks, its checkpoint
        and the whole checkpoint a delta extends."""
        found = self.lookup(prompt)
        if found.tokens == 0:
            return []
        chain = list(found.blocks)
        if found.checkpoint is not None:
            chain.append(found.checkpoint)
            with self.entries.lock:
                base = self.entries.base_of(found.checkpoint) if found.checkpoint.extends else None
            chain += [base] if base is not None else []
        return chain

    @property
    def problem(self) -> str | None:
        """Why the disk tier is off (or what it repaired at start-up); None when all is well."""
        return self.disk.problem

    def take_notice(self) -> str | None:
        """`problem`, or that a failed restore check stopped reuse, the first time it is asked for: the app
        tells the user once."""
        for problem in (self.disk.problem, STOPPED_NOTICE if self.checks.suspended else None):
            if problem is not None and problem not in self._told:
                self._told.add(problem)
                return problem
        return None

    def record_request(
        self,
        prompt: Sequence[int] | np.ndarray,
        reused_tokens: int,
        tier: ReuseTier,
        *,
        in_place: int = 0,
        limit: int | None = None,
        prefill_ms: float = 0.0,
        started: float | None = None,
    ) -> None:
        """Count a request, and log it for sizing advice: `in_place` tokens the live context held
        without the cache, `limit` the most the cache could have served, `prefill_ms` computing the rest,
        `started` when it was placed (wall clock: before what it stored while it ran)."""
        array = as_token_array(prompt)
        logging_it = self.recorder.log.enabled
        keys = self.index.keys_for(array) if logging_it else []  # hashed once, outside the lock
        with self.entries.lock:
            self.recorder.count(int(array.size), reused_tokens, tier)
            if not logging_it:
                return
            # Besides whole blocks, a restore may end inside a stored block that shares only its first
            # tokens with the prompt (plain models), or at a checkpoint (the others): logged as marks.
            marks = (
                self.index.checkpoints_along(array, int(array.size))
                if self.layout.memory.restores_at_checkpoints
                else self.recorder.partial_matches(self.index, array, keys)
            )
        self.recorder.log_request(
            array,
            keys,
            marks,
            reused_tokens,
            tier,
            in_place=in_place,
            limit=limit,
            prefill_ms=prefill_ms,
            started=started,
        )

    # Storing (engine thread hands over; the writer thread works).
    def has_new_blocks(self, tokens: list[int], upto: int | None = None) -> bool:
        """See `StoreWriter.has_new_blocks`."""
        return self.writer.has_new_blocks(tokens, upto)

    def has_checkpoint(self, tokens: list[int]) -> bool:
        """See `StoreWriter.has_checkpoint`."""
        return self.writer.has_checkpoint(tokens)

    def store(self, tokens: list[int], state: np.ndarray, upto: int | None = None, *, ram: bool = True) -> None:
        """See `StoreWriter.store`."""
        self.writer.store(tokens, state, upto, ram=ram)

    def store_checkpoint(self, tokens: list[int], payload: bytes) -> None:
        """See `StoreWriter.store_checkpoint`."""
        self.writer.store_checkpoint(tokens, payload)

    @property
    def busy(self) -> bool:
        """Whether the writer has work left (a store being written, say)."""
        return self.writer.busy

    def flush(self) -> None:
        """Wait until everything handed to `store` is in every tier (and what RAM served, refreshed there)."""
        self.writer.flush()

    def close(self) -> None:
        """Finish pending stores, add this session's counters to the lifetime totals, close."""
        self.writer.stop()
        if self.disk.enabled:
            try:
                add_totals(self.disk.directory, self.session_counters())
            except OSError as error:  # lifetime figures are a nicety; closing must not fail
                log.warning("could not add this session's figures to the totals: %s", error)
        self.tiers.close()

    def session_counters(self) -> dict[str, object]:
        with self.entries.lock:
            requests = self.recorder.counters
            return {
                "requests": requests.requests,
                "prompt_tokens": requests.prompt_tokens,
                "reused_tokens": requests.reused_tokens,
                "reused_by_tier": dict(requests.reused_by_tier),
                "ram": self.ram.counters.as_dict(),
                "disk": self.disk.counters.as_dict(),
            }

    # Maintenance.
    def pin(self, tokens: list[int], pinned: bool = True, keep: Sequence[Sequence[int]] = ()) -> int:
        """See `Pins.pin`; what is being stored is stored first."""
        self.flush()
        return self.pins.pin(tokens, pinned, keep)

    def forget(self, prompts: Sequence[Sequence[int]], keep: Sequence[Sequence[int]] = ()) -> int:
        """Remove from every tier, now, every entry requests beginning as one of `prompts` may have stored
        that none of `keep` uses: what a deleted conversation alone held, which is in effect its text. Pinned
        entries, and a whole checkpoint a kept delta extends, stay. A kept prompt that ended inside one of the
        deleted prompt's blocks (its own shorter block was never stored: that one covered it) computes those
        tokens again: the block holds deleted text. How many entries went."""
        self.flush()
        self.entries.learn_new()
        with self.entries.lock:
            going = {info.key: info for prompt in prompts for info in self.index.entries_along(as_token_array(prompt))}
            for prompt in keep:
                for info in self.index.entries_along(as_token_array(prompt)):
                    going.pop(info.key, None)
            extended = {info.extends for info in self.index.checkpoints.values() if info.key not in going}
            gone = [info for key, info in going.items() if not info.pinned and key not in extended]
            for info in gone:
                self.recorder.forget(info.key)
        for info in gone:
            self.entries.forget(info)
        return len(gone)

    def prune(self) -> int:
        return self.tiers.prune()

    def clear(self) -> int:
        """Every entry dropped from every tier; how many the disk held (of every namespace in its folder)."""
        self.flush()
        with self.entries.lock:
            self.index.clear()
            self.recorder.reset()
        return self.tiers.clear()[self.tiers.tiers.index(self.disk)]

    def stats(self) -> CacheStats:
        with self.entries.lock:
            requests = self.recorder.counters
            pinned = sum(1 for info in self.index.everything() if info.pinned)
            return {
                "namespace": self.namespace.id,
                "block_size": self.config.block_size,
                "index_entries": len(self.index),
                "pinned_entries": pinned,
                "requests": requests.requests,
                "prompt_tokens": requests.prompt_tokens,
                "reused_tokens": requests.reused_tokens,
                "hit_rate": round(requests.hit_rate, 4),
                "reused_by_tier": dict(requests.reused_by_tier),
                "ram": self.ram.stats(),
                "checks": self.checks.counts().as_stats(),
                "memory": {
                    "kind": self.layout.kind.value,
                    "window": self.layout.window,
                    "checkpoints": len(self.index.checkpoints),
                    "checkpoint_bytes": sum(info.payload_size for info in self.index.checkpoints.values()),
                },
                "disk": self.disk.stats(),
                "more_tiers": [dict(tier.stats()) for tier in self.tiers.tiers[2:]],
            }
