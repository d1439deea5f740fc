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

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from cache.blocks import BlockInfo, PayloadParts, payload_checksum
from cache.disk_tier import DiskTier
from cache.eviction import POLICY_NAMES, BlockPlace, make_policy
from cache.index import BlockIndex
from cache.keys import BlockKey, as_token_array
from cache.maintenance import add_totals, remember_memory
from cache.namespace import Namespace
from cache.ram_tier import RamTier
from cache.request_log import DEFAULT_MAX_BYTES
from cache.request_recorder import RequestRecorder
from cache.restore_checks import RestoreChecks
from cache.state_assembly import StateAssembly, StateBuffer, in_parallel
from cache.state_format import (
    MemoryLayout,
    StateFormatError,
    checkpoint_tail,
    join_checkpoint,
    parse_state,
    piece_parts,
    read_checkpoint,
)
from cache.stats import CacheStats
from cache.tiers import ReuseTier
from cache.writer_pace import StoreBacklog, WriterPace, lower_this_thread_priority

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
    `usable`), whether it read disk, the blocks RAM served, and the prefix's tokens."""

    state: np.ndarray | None
    usable: int
    from_disk: bool
    served_by_ram: list[BlockInfo]
    tokens: int


def place_of(info: BlockInfo) -> BlockPlace:
    """A block's place in the prefix tree, for the RAM tier's policy; a checkpoint hangs off its anchor
    and costs the tokens from the anchor to its position."""
    return BlockPlace(info.parent, info.start, int(info.tokens.size))


class PrefixCache:
    def __init__(
        self, directory: Path, namespace: Namespace, layout: MemoryLayout, config: CacheConfig = CacheConfig()
    ) -> None:
        self.namespace = namespace
        self.layout = layout
        self.config = config
        self.index = BlockIndex(config.block_size, namespace.seed)
        self.ram = RamTier(config.ram_budget_bytes, config.ttl_seconds, policy=make_policy(config.eviction_policy))
        self.disk = DiskTier(directory, config.disk_budget_bytes, config.ttl_seconds, bytes.fromhex(namespace.id))
        self.recorder = RequestRecorder(
            directory, layout, config.block_size, namespace.seed, config.request_log_bytes, enabled=self.disk.enabled
        )
        self.checks = RestoreChecks(directory, namespace.id, every=config.check_every, enabled=self.disk.enabled)
        self._lock = threading.RLock()
        self._told: set[str] = set()
        for info in self.disk.new_entries():
            self.index.add(info)
            self.recorder.remember(info)
        try:
            k_type = layout.kv_ggml_types[0]  # the KV cells' type, for `cache stats` (-1: none)
            remember_memory(directory, {"kind": layout.kind.value, "window": layout.window, "k_type": k_type})
        except OSError as error:  # a figure for `cache stats`; the disk tier says what is wrong
            log.warning("could not note the model's memory kind: %s", error)
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue()  # the writer's work
        self._writer = threading.Thread(target=self._write_loop, name="chatapp-cache-writer", daemon=True)
        self._backlog = StoreBacklog(config.ram_budget_bytes)
        self.pace = WriterPace()  # the engine tells it when the model computes
        self._writer.start()

    # Lookup and restore (engine thread).
    def lookup(self, prompt: np.ndarray, limit: int | None = None) -> CachedPrefix:
        """The longest prefix of `prompt`, at most `limit` tokens, the cache can restore."""
        array = as_token_array(prompt)
        limit = int(array.size) if limit is None else min(limit, int(array.size))
        memory = self.layout.memory
        news = self.disk.new_entries()  # what other processes (or our writer) stored meanwhile
        with self._lock:
            self._absorb(news)
            match = self.index.longest_prefix(array) if memory.has_blocks else None
            covered = min(match.matched_tokens, limit) if match is not None else limit
            if not memory.restores_at_checkpoints:
                assert match is not None
                return CachedPrefix(covered, match.blocks, None)
        checkpoint = self._deepest_restorable(array, covered)
        if checkpoint is None:
            return CachedPrefix(0, (), None)
        end = checkpoint.end
        blocks = tuple(block for block in match.blocks if block.start < end) if match is not None else ()
        return CachedPrefix(end, blocks, checkpoint)

    def _absorb(self, news: list[BlockInfo]) -> None:
        """Index what other processes (or our writer) stored since the last look (under the lock)."""
        for info in news:
            known = self.index.get(info.key)
            if known is not None and (known.checksum, known.pinned) != (info.checksum, info.pinned):
                # Stored again (or pinned) by another process since: its record is current,
                # and a copy of the old bytes in RAM must not be served under it.
                self.index.remove(info.key)
                self.ram.discard(info.key)
            self.index.add(info)
            self.recorder.remember(info)

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
        """A lookup's prefix as a state for `dest_seq` (see StateAssembly), from RAM, else disk.

        Blocks read from disk go straight into the state, each through memory of one block's size:
        kept by RAM when `keep_blocks` (no copy), else the reading thread's scratch (a caller that
        keeps the whole state instead). A missing or damaged block shortens a plain model's prefix to
        the blocks before it; a model that needs its checkpoint gets nothing unless every block and
        the checkpoint are there.
        """
        if found.tokens == 0:
            return None
        tier = ReuseTier.RAM
        served_by_ram: list[BlockInfo] = []
        checkpoint: bytes | None = None
        if found.checkpoint is not None:
            got = self._checkpoint_of(found.checkpoint)
            if got is None:
                return None
            checkpoint, from_disk, from_ram = got
            tier = ReuseTier.DISK if from_disk else tier
            served_by_ram.extend(from_ram)
        memory = self.layout.memory
        blocks = list(found.blocks)
        read_disk = False
        while True:
            try:
                filled = self._fill(blocks, found, checkpoint, dest_seq, buffer, window_ring, keep_blocks)
            except StateFormatError as error:
                log.warning("cannot assemble a cached prefix: %s", error)
                return None
            if filled is None:
                return None
            read_disk = read_disk or filled.from_disk
            if filled.state is not None:
                break
            if memory.restores_at_checkpoints or filled.usable == 0:
                return None
            blocks = blocks[: filled.usable]  # again up to the block that was lost (rare: RAM keeps those read)
        tier = ReuseTier.DISK if read_disk else tier
        served_by_ram.extend(filled.served_by_ram)
        if served_by_ram:
            # The disk's copies are used too (one recency over both tiers): refreshed on the writer thread.
            self._queue.put(partial(self.disk.refresh, served_by_ram))
        prefix = tuple(int(token) for token in as_token_array(prompt)[: filled.tokens])
        return FetchedPrefix(tuple(blocks), filled.state, filled.tokens, checkpoint, tier, prefix)

    def _checkpoint_of(self, info: BlockInfo) -> tuple[bytes, bool, list[BlockInfo]] | None:
        """A checkpoint's whole payload (a delta joined to its base), whether any of it came from disk, and the
        entries RAM served; None when it is lost."""
        payload, from_disk = self._payload(info)
        if payload is None:
            return None
        from_ram = [] if from_disk else [info]
        if info.extends is None:
            return payload, from_disk, from_ram
        joined, base_from_disk = self._joined_delta(info, payload)
        if joined is None:
            return None
        if not base_from_disk:
            with self._lock:
                base = self._base_of(info)
            from_ram.extend([base] if base is not None else [])
        return joined, from_disk or base_from_disk, from_ram

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

        RAM's blocks are taken deepest first and disk's marked used shallowest first (kept longest), then
        RAM keeps the ones read from disk too, deepest first: the tiers' LRU must evict a prefix's last
        block before its first (a block without its parents cannot be restored)."""
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
        in_ram: dict[int, bytes | np.ndarray] = {}
        for number in reversed(range(assembly.pieces)):
            info = blocks[number]
            payload = self.ram.get(info.key, info.checksum)
            if payload is not None:
                in_ram[number] = payload
        pieces = [(number, payload) for number, payload in sorted(in_ram.items())]

        def fill(chosen: slice) -> None:
            for number, payload in pieces[chosen]:
                assembly.fill(number, payload)

        in_parallel(fill, len(pieces), sum(len(payload) for _, payload in pieces))
        on_disk = [number for number in range(assembly.pieces) if number not in in_ram]
        kept: dict[int, bytes | np.ndarray] = {}

        def sink(index: int, payload: bytes | memoryview | np.ndarray) -> None:
            assembly.fill(on_disk[index], payload)
            if keep_blocks and not isinstance(payload, memoryview):  # new memory, or a row's own bytes
                kept[on_disk[index]] = payload

        with self.disk.reading() if on_disk else contextlib.nullcontext():  # the disk's reads in one transaction
            read = self.disk.read_into([blocks[number] for number in on_disk], sink, keep=keep_blocks)
        lost = [number for number, intact in zip(on_disk, read, strict=True) if not intact]
        for number in lost:
            self._forget(blocks[number])
        usable = min(lost, default=len(blocks))
        for number in reversed(range(min(usable, assembly.pieces))):
            if number in kept:
                self._keep_read(blocks[number], kept[number])
            elif number in in_ram:
                self.ram.touch(blocks[number].key)
        if lost:
            return _Filled(None, usable, True, [], tokens)
        served = [blocks[number] for number in sorted(in_ram)]
        return _Filled(assembly.finish(), usable, bool(on_disk), served, tokens)

    def _keep_read(self, info: BlockInfo, payload: bytes | np.ndarray) -> None:
        """RAM keeps a block read from disk, unless forgotten, stored again or pinned since: as the index says now."""
        with self._lock:
            current = self.index.get(info.key)
        if current is not None and current.checksum == info.checksum:
            if isinstance(payload, np.ndarray):
                payload.flags.writeable = False
            self._keep_in_ram(current, payload)

    def slowest_tier(self, found: CachedPrefix) -> ReuseTier:
        """Where a fetch of `found` would read from: RAM when every entry is there, else disk."""
        wanted = [*found.blocks, *((found.checkpoint,) if found.checkpoint is not None else ())]
        return ReuseTier.RAM if all(info.key in self.ram for info in wanted) else ReuseTier.DISK

    def _deepest_restorable(self, tokens: np.ndarray, limit: int) -> BlockInfo | None:
        """The deepest checkpoint of `tokens` at or before `limit` that can be restored: a whole
        one, or a delta on a whole one still stored. Deltas whose base is gone are forgotten."""
        orphans: list[BlockInfo] = []
        with self._lock:
            while True:
                found = self.index.deepest_checkpoint(tokens, limit)
                if found is None or found.extends is None:
                    break
                if self._base_of(found) is not None:
                    break
                self.index.remove(found.key)
                orphans.append(found)
        for orphan in orphans:
            # Forgotten here only: its base may just be unknown to this process yet, and its
            # record on disk ages out like any other.
            self.ram.discard(orphan.key)
        return found

    def _base_of(self, delta: BlockInfo) -> BlockInfo | None:
        """The whole checkpoint `delta` was built on, if the index holds it with the same bytes."""
        base = self.index.checkpoints.get(delta.extends) if delta.extends is not None else None
        if base is None or base.extends is not None or base.checksum != delta.extends_checksum:
            return None  # gone, stored again as a delta itself, or stored again with other bytes
        return base

    def _joined_delta(self, delta: BlockInfo, tail: bytes) -> tuple[bytes | None, bool]:
        """The full checkpoint of a delta (and whether its base came from disk); None, and the
        delta forgotten, when the checkpoint it extends is gone or does not join."""
        with self._lock:
            base = self._base_of(delta)
        payload, from_disk = self._payload(base) if base is not None else (None, False)
        if base is None or payload is None:
            # Forgotten by this process only: another one may hold the base it was built on.
            with self._lock:
                self.index.remove(delta.key)
            self.ram.discard(delta.key)
            return None, False
        try:
            return join_checkpoint(self.layout, payload, base.end, tail, delta.end), from_disk
        except StateFormatError as error:
            log.warning("dropping a checkpoint that does not restore: %s", error)
            self._forget(delta)
            return None, False

    def _keep_in_ram(self, info: BlockInfo, payload: bytes | np.ndarray) -> None:
        self.ram.put(info.key, payload, pinned=info.pinned, place=place_of(info), checksum=info.checksum)

    def _payload(self, info: BlockInfo) -> tuple[bytes | None, bool]:
        """An entry's payload and whether it came from disk; a lost entry is forgotten."""
        kept = self.ram.get(info.key, info.checksum)
        if kept is not None:  # a block a restore read from disk is memory RAM kept: bytes of it for the caller
            return kept if isinstance(kept, bytes) else kept.tobytes(), False
        payload = self.disk.get(info)
        if payload is None:
            self._forget(info)
            return None, False
        self._keep_in_ram(info, payload)
        return payload, True

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
        with self._lock:
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
        """Whether the first `upto` of `tokens` (all by default) hold any block (or, where the model
        needs one and `upto` is all of them, a checkpoint at their end) no tier keeps: not stored yet, or
        named by the index though lost (cheap: hashes, and one disk query for blocks not in RAM)."""
        array = as_token_array(tokens)
        whole = upto is None or upto >= array.size
        memory = self.layout.memory
        with self._lock:
            blocks = self.index.keys_for(array if whole else array[:upto]) if memory.has_blocks else []
            keys = [key for key, _, _, _ in blocks]
            if whole and memory.restores_at_checkpoints:
                keys.append(self.index.checkpoint_key(array)[0])
            known = [self.index.get(key) for key in keys]
        indexed = [info for info in known if info is not None]
        return len(indexed) < len(known) or bool(self._drop_lost(indexed))

    def has_checkpoint(self, tokens: list[int]) -> bool:
        """Whether a tier keeps a checkpoint at the end of `tokens` (a lost one is forgotten, to be stored again)."""
        with self._lock:
            info = self.index.get(self.index.checkpoint_key(as_token_array(tokens))[0])
        return info is not None and not self._drop_lost([info])

    def store(self, tokens: list[int], state: np.ndarray, upto: int | None = None, *, ram: bool = True) -> None:
        """Keep the blocks (and checkpoint) of a sequence holding `tokens`, whose full state was just read.

        With `upto`, only the blocks within its first `upto` tokens, and no checkpoint unless that is
        all of them: the rest was computed otherwise than a cold run computes it (a fixed grid's
        last, partial batch, or an answer's tokens). Without `ram` the blocks go to disk only (the
        caller keeps the whole state in RAM instead), unless there is no disk tier.
        """
        array = as_token_array(tokens).copy()
        upto = array.size if upto is None else min(upto, array.size)
        # The states waiting for the writer hold at most RAM's budget (writer_pace.py): past it, the oldest go.
        self._queue.put(self._backlog.queued(partial(self._store_now, array, state, False, upto, ram), state.nbytes))

    def store_checkpoint(self, tokens: list[int], payload: bytes) -> None:
        """Keep a checkpoint (`checkpoint_payload` of a state read after `tokens`)."""
        array = as_token_array(tokens).copy()
        self._queue.put(partial(self._store_now, array, np.frombuffer(payload, dtype=np.uint8), True, array.size, True))

    @property
    def busy(self) -> bool:
        """Whether the writer has work left (a store being written, say)."""
        return self._queue.unfinished_tasks > 0

    def flush(self) -> None:
        """Wait until everything handed to `store` is in RAM and on disk (and what RAM served, refreshed there)."""
        self._queue.join()

    def close(self) -> None:
        """Finish pending stores, add this session's counters to the lifetime totals, close."""
        self.flush()
        self._queue.put(None)
        self._writer.join()
        if self.disk.enabled:
            try:
                add_totals(self.disk.directory, self.session_counters())
            except OSError as error:  # lifetime figures are a nicety; closing must not fail
                log.warning("could not add this session's figures to the totals: %s", error)
        self.disk.close()

    def session_counters(self) -> dict[str, object]:
        with self._lock:
            requests = self.recorder.counters
            return {
                "requests": requests.requests,
                "prompt_tokens": requests.prompt_tokens,
                "reused_tokens": requests.reused_tokens,
                "reused_by_tier": dict(requests.reused_by_tier),
                "ram": self.ram.counters.as_dict(),
                "disk": self.disk.counters.as_dict(),
            }

    def _write_loop(self) -> None:
        lower_this_thread_priority()
        while (work := self._queue.get()) is not None:
            try:
                work()
            except Exception:  # a failed save loses a cache entry, never a conversation
                log.exception("could not store KV blocks (or refresh them on disk)")
            finally:
                work = None  # the job holds the state it stored: let it go now, not when the next job comes
                self._queue.task_done()
        self._queue.task_done()

    def _store_now(self, tokens: np.ndarray, data: np.ndarray, is_checkpoint: bool, upto: int, ram: bool) -> None:
        memory = self.layout.memory
        try:
            if is_checkpoint:
                read_checkpoint(self.layout, data.data, int(tokens.size))  # refuse what would not restore
                self._store_checkpoint(tokens, data.tobytes())
                return
            state = parse_state(data, memory)
            if state.layout(memory) != self.layout or state.n_cells != tokens.size:
                raise StateFormatError("the state does not match its tokens or this cache's layout")
            order: np.ndarray | None = None
            if state.base is not None:
                order, first = state.base.order()
                if first != 0:
                    raise StateFormatError("the full-attention cells do not start at position 0")
            whole = upto == tokens.size
            checkpoint = memory.checkpoint_of(state) if whole else None
            if checkpoint is not None:
                read_checkpoint(self.layout, checkpoint, int(tokens.size))
        except StateFormatError as error:
            log.warning("not storing a sequence: %s", error)
            return
        if checkpoint is not None:
            self._store_checkpoint(tokens, checkpoint)
        if state.base is None or order is None:
            return
        planned = self._blocks_to_store(tokens[:upto])
        ram = ram or not self.disk.enabled
        stored: list[BlockInfo] = []
        # Deepest first, as reads go (see fetch): the tiers' LRU then keeps a prefix's first blocks longest.
        with self.disk.segment() as segment:  # one file for the blocks of this store, read back in one pass
            for key, parent, start, end in reversed(planned):
                began = time.perf_counter()
                block_tokens = tokens[start:end].copy()
                if end - start < self.config.block_size and self._covered_by_sibling(parent, block_tokens):
                    continue  # a longer stored block already holds these tokens
                parts = PayloadParts(piece_parts(state.base, order, start, end))
                payload = parts.joined() if ram else parts  # RAM keeps bytes; the disk writes the parts as they are
                info = BlockInfo(key, parent, start, block_tokens, parts.nbytes, payload_checksum(payload))
                if isinstance(payload, bytes):
                    self.ram.put(key, payload, place=place_of(info), checksum=info.checksum)
                self.disk.put(info, payload, segment)
                stored.append(info)
                with self._lock:
                    self.index.add(info)
                    self.recorder.remember(info)
                    superseded = [
                        sibling
                        for sibling in self.index.children(parent)
                        if sibling.key != key
                        and sibling.tokens.size < block_tokens.size
                        and np.array_equal(sibling.tokens, block_tokens[: sibling.tokens.size])
                        and not sibling.pinned
                    ]
                for sibling in superseded:
                    self._forget(sibling)
                self.pace.after(time.perf_counter() - began)  # indexed: a rest leaves nothing half done
        self.recorder.log_stored(stored[::-1])

    def _blocks_to_store(self, tokens: np.ndarray) -> list[tuple[BlockKey, BlockKey, int, int]]:
        """The blocks of `tokens` no tier keeps: new ones, and lost ones (`_drop_lost`)."""
        with self._lock:
            entries = self.index.keys_for(tokens)
            known = [self.index.entries.get(entry[0]) for entry in entries]
        lost = self._drop_lost([info for info in known if info is not None])
        return [entry for entry, info in zip(entries, known, strict=True) if info is None or info.key in lost]

    def _drop_lost(self, known: list[BlockInfo]) -> set[BlockKey]:
        """Forget the indexed entries no tier keeps any more, and return their keys: RAM evicted them and a
        disk cull took them (here or in another process), which the index learns only here or when a fetch
        misses. Forgotten, they are stored again when computed again, as sizing advice counts: else a popular
        prefix lost once stays lost while the index names it. One disk query, for those not in RAM; a record
        another process replaced meanwhile is current and stays."""
        not_in_ram = [info for info in known if info.key not in self.ram]
        on_disk = self.disk.holding(not_in_ram) if not_in_ram else set()
        lost: set[BlockKey] = set()
        with self._lock:
            for info in not_in_ram:
                if info.key not in on_disk and self.index.get(info.key) is info:
                    self.index.remove(info.key)
                    lost.add(info.key)
        return lost

    def _store_checkpoint(self, tokens: np.ndarray, payload: bytes) -> None:
        """Store a checkpoint (validated by the caller) at the end of `tokens`.

        One fewer than `checkpoint_min_gap` tokens after a stored checkpoint on the same
        tokens is not stored. Where a whole checkpoint on the same tokens is at most half a
        window behind, only the window cells after it are stored (a delta): consecutive
        checkpoints of one conversation share most of their windows.
        """
        end = int(tokens.size)
        with self._lock:
            key, anchor, anchor_position = self.index.checkpoint_key(tokens)
            known = self.index.get(key)
        if known is not None and not self._drop_lost([known]):
            return
        earlier = self._deepest_restorable(tokens, end - 1)
        if earlier is not None and end - earlier.end < self.config.checkpoint_min_gap:
            return
        extends = self._whole_checkpoint_to_extend(earlier, end)
        stored = payload
        if extends is not None:
            try:
                stored = checkpoint_tail(self.layout, payload, end, end - extends.end)
            except StateFormatError as error:
                log.warning("storing a whole checkpoint: %s", error)
                extends = None
        tail = tokens[anchor_position:].copy()
        info = BlockInfo(
            key,
            anchor,
            anchor_position,
            tail,
            len(stored),
            payload_checksum(stored),
            checkpoint=True,
            extends=extends.key if extends is not None else None,
            extends_checksum=extends.checksum if extends is not None else 0,
        )
        self.ram.put(key, stored, place=place_of(info), checksum=info.checksum)
        self.disk.put(info, stored)
        with self._lock:
            self.index.add(info)
        self.recorder.log_stored([info])

    def _whole_checkpoint_to_extend(self, earlier: BlockInfo | None, end: int) -> BlockInfo | None:
        """The whole checkpoint a checkpoint at `end` may be stored as a delta on: `earlier` (the
        deepest before it on the same tokens) or the one `earlier` extends, at most half a
        window behind. Deltas are one level deep: a restore reads at most two checkpoints."""
        if earlier is None:
            return None
        if earlier.extends is not None:
            with self._lock:
                earlier = self._base_of(earlier)
            if earlier is None:
                return None
        return earlier if self.layout.memory.extends_checkpoint(earlier.end, end) else None

    def _covered_by_sibling(self, parent: BlockKey, tokens: np.ndarray) -> bool:
        with self._lock:
            return any(
                sibling.tokens.size >= tokens.size and np.array_equal(sibling.tokens[: tokens.size], tokens)
                for sibling in self.index.children(parent)
            )

    def _forget(self, info: BlockInfo) -> None:
        with self._lock:
            self.index.remove(info.key)
        self.ram.discard(info.key)
        self.disk.delete(info)

    # Maintenance.
    def pin(self, tokens: list[int], pinned: bool = True, keep: Sequence[Sequence[int]] = ()) -> int:
        """Pin (or unpin) the stored blocks of this prefix, and its deepest checkpoint, so eviction and TTL
        pass over them; how many of its entries are now as asked.

        Only entries whose state changes are read and moved, so pinning a prefix that extends a pinned
        one costs its new blocks only. An unpin leaves pinned what the prefixes in `keep` (pins that
        share blocks with this one) still hold.
        """
        self.flush()
        chain = self._pin_chain(self.lookup(as_token_array(tokens)))
        kept: set[BlockKey] = set()
        for other in keep if not pinned else ():
            kept.update(info.key for info in self._pin_chain(self.lookup(as_token_array(other))))
        done = 0
        for info in chain:
            if info.pinned == pinned:
                done += 1
                continue
            if not pinned and (info.key in kept or self._pinned_delta_on(info)):
                continue  # another pin still needs it
            payload, _from_disk = self._payload(info)
            if payload is None:
                if pinned:
                    break  # lost: what follows cannot be restored without it
                continue
            self.disk.set_pinned(info, payload, pinned)
            self.ram.set_pinned(info.key, pinned)
            done += 1
        return done

    def _pin_chain(self, found: CachedPrefix) -> list[BlockInfo]:
        """The entries a restore of `found` reads, in order: its blocks, its checkpoint and the whole
        checkpoint a delta extends."""
        if found.tokens == 0:
            return []
        chain = list(found.blocks)
        if found.checkpoint is not None:
            chain.append(found.checkpoint)
            with self._lock:
                base = self._base_of(found.checkpoint) if found.checkpoint.extends else None
            chain += [base] if base is not None else []
        return chain

    def _pinned_delta_on(self, base: BlockInfo) -> bool:
        """Whether a pinned checkpoint delta extends `base` (a chain unpins its own delta before its base)."""
        with self._lock:
            return any(info.pinned and info.extends == base.key for info in self.index.checkpoints.values())

    def forget(self, prompts: Sequence[Sequence[int]], keep: Sequence[Sequence[int]] = ()) -> int:
        """Remove from RAM and disk, now, every entry requests beginning as one of `prompts` may have stored
        that none of `keep` uses: what a deleted conversation alone held, which is in effect its text. Pinned
        entries, and a whole checkpoint a kept delta extends, stay. A kept prompt that ended inside one of the
        deleted prompt's blocks (its own shorter block was never stored: that one covered it) computes those
        tokens again: the block holds deleted text. How many entries went."""
        self.flush()
        news = self.disk.new_entries()
        with self._lock:
            self._absorb(news)
            going = {info.key: info for prompt in prompts for info in self.index.entries_along(as_token_array(prompt))}
            for prompt in keep:
                for info in self.index.entries_along(as_token_array(prompt)):
                    going.pop(info.key, None)
            extended = {info.extends for info in self.index.checkpoints.values() if info.key not in going}
            gone = [info for key, info in going.items() if not info.pinned and key not in extended]
            for info in gone:
                self.recorder.forget(info.key)
        for info in gone:
            self._forget(info)
        return len(gone)

    def prune(self) -> int:
        return self.ram.prune() + self.disk.prune()

    def clear(self) -> int:
        self.flush()
        with self._lock:
            self.index = BlockIndex(self.config.block_size, self.namespace.seed)
            self.recorder.reset()
        self.ram.clear()
        return self.disk.clear()

    def stats(self) -> CacheStats:
        with self._lock:
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
                "ram": {
                    "eviction_policy": self.ram.policy.name,
                    "entries": len(self.ram),
                    "bytes": self.ram.bytes_used,
                    "budget_bytes": self.ram.budget_bytes,
                    **self.ram.counters.as_dict(),
                },
                "checks": self.checks.counts().as_stats(),
                "memory": {
                    "kind": self.layout.kind.value,
                    "window": self.layout.window,
                    "checkpoints": len(self.index.checkpoints),
                    "checkpoint_bytes": sum(info.payload_size for info in self.index.checkpoints.values()),
                },
                "disk": {
                    "enabled": self.disk.enabled,
                    "problem": self.disk.problem,
                    **self.disk.sizes(),
                    "budget_bytes": self.disk.budget_bytes,
                    "ttl_seconds": self.disk.ttl_seconds,
                    **self.disk.counters.as_dict(),
                },
            }
