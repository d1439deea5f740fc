"""The prefix cache: find the longest stored prefix of a prompt, fetch its blocks, store new ones.

Blocks live in RAM (LRU, TTL) and on disk (diskcache, LRU, TTL), found through one
in-memory index. Storing runs on a background thread: the caller hands over a copy of
a sequence's state and returns at once; slicing it into blocks, hashing, and writing
through to disk never hold up the token stream. Thread-safe.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cache.blocks import BlockInfo, payload_checksum
from cache.disk_tier import DiskTier
from cache.index import BlockIndex, PrefixMatch
from cache.keys import BlockKey, as_token_array
from cache.maintenance import add_totals
from cache.namespace import Namespace
from cache.ram_tier import RamTier
from cache.state_format import KVLayout, StateFormatError, cells_in_position_order, extract_piece, parse_sequence_state
from cache.stats import CacheStats, RequestCounters
from cache.tiers import ReuseTier

log = logging.getLogger(__name__)

GIB = 1 << 30
DAY = 24 * 3600.0


WRITER_NICENESS = 10


def _lower_this_thread_priority() -> None:
    """Let the model's threads go first: storing is background work that must not slow a prefill.

    On Linux a thread has its own nice value; elsewhere this does nothing.
    """
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICENESS)


@dataclass(frozen=True)
class CacheConfig:
    """Sizes and lifetimes; the defaults suit a laptop."""

    block_size: int = 64
    ram_budget_bytes: int = 2 * GIB
    disk_budget_bytes: int = 10 * GIB
    ttl_seconds: float = 7 * DAY


@dataclass(frozen=True)
class FetchedPrefix:
    """Payloads of the blocks to restore, how many tokens of them match, and the slowest tier used."""

    blocks: tuple[BlockInfo, ...]
    payloads: tuple[bytes, ...]
    matched_tokens: int
    tier: ReuseTier

    @property
    def tokens(self) -> list[int]:
        return [int(token) for block in self.blocks for token in block.tokens]


class PrefixCache:
    def __init__(
        self, directory: Path, namespace: Namespace, layout: KVLayout, config: CacheConfig = CacheConfig()
    ) -> None:
        self.namespace = namespace
        self.layout = layout
        self.config = config
        self.index = BlockIndex(config.block_size, namespace.seed)
        self.ram = RamTier(config.ram_budget_bytes, config.ttl_seconds)
        self.disk = DiskTier(directory, config.disk_budget_bytes, config.ttl_seconds, bytes.fromhex(namespace.id))
        self.requests = RequestCounters()
        self._lock = threading.RLock()
        self._told: set[str] = set()
        for info in self.disk.load_index():
            self.index.add(info)
        self._queue: queue.Queue[tuple[np.ndarray, np.ndarray] | None] = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="chatapp-cache-writer", daemon=True)
        self._writer.start()

    # Lookup and restore (engine thread).
    def lookup(self, prompt: np.ndarray) -> PrefixMatch:
        with self._lock:
            return self.index.longest_prefix(as_token_array(prompt))

    def fetch(self, match: PrefixMatch) -> FetchedPrefix | None:
        """Payloads of `match`'s blocks from RAM, else disk (promoted to RAM); stops at a missing block."""
        blocks: list[BlockInfo] = []
        payloads: list[bytes] = []
        tier = ReuseTier.RAM
        for info in match.blocks:
            payload = self.ram.get(info.key)
            if payload is None:
                payload = self.disk.get(info)
                if payload is None:
                    self._forget(info)
                    break
                tier = ReuseTier.DISK
                self.ram.put(info.key, payload, pinned=info.pinned)
            blocks.append(info)
            payloads.append(payload)
        if not blocks:
            return None
        matched = min(match.matched_tokens, blocks[-1].end)
        return FetchedPrefix(tuple(blocks), tuple(payloads), matched, tier)

    @property
    def problem(self) -> str | None:
        """Why the disk tier is off (or what it repaired at start-up); None when all is well."""
        return self.disk.problem

    def take_notice(self) -> str | None:
        """`problem`, the first time it is asked for: the app tells the user once."""
        problem = self.disk.problem
        if problem is None or problem in self._told:
            return None
        self._told.add(problem)
        return problem

    def record_request(self, prompt_tokens: int, reused_tokens: int, tier: ReuseTier) -> None:
        with self._lock:
            self.requests.requests += 1
            self.requests.prompt_tokens += prompt_tokens
            self.requests.reused_tokens += reused_tokens
            if tier in self.requests.reused_by_tier:
                self.requests.reused_by_tier[tier] += reused_tokens

    # Storing (engine thread hands over; the writer thread works).
    def has_new_blocks(self, tokens: list[int]) -> bool:
        """Whether `tokens` hold any block not stored yet (cheap: hashes only)."""
        array = as_token_array(tokens)
        with self._lock:
            return any(key not in self.index for key, _, _, _ in self.index.keys_for(array))

    def store(self, tokens: list[int], state: np.ndarray) -> None:
        """Keep the blocks of a sequence holding `tokens`, whose state was just read."""
        self._queue.put((as_token_array(tokens).copy(), state))

    def flush(self) -> None:
        """Wait until everything handed to `store` is in RAM and on disk."""
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
            requests = self.requests
            return {
                "requests": requests.requests,
                "prompt_tokens": requests.prompt_tokens,
                "reused_tokens": requests.reused_tokens,
                "reused_by_tier": dict(requests.reused_by_tier),
                "ram": self.ram.counters.as_dict(),
                "disk": self.disk.counters.as_dict(),
            }

    def _write_loop(self) -> None:
        _lower_this_thread_priority()
        while (item := self._queue.get()) is not None:
            try:
                self._store_now(*item)
            except Exception:  # a failed save loses a cache entry, never a conversation
                log.exception("could not store KV blocks")
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def _store_now(self, tokens: np.ndarray, state_bytes: np.ndarray) -> None:
        try:
            state = parse_sequence_state(state_bytes)
        except StateFormatError as error:
            log.warning("not storing a sequence: %s", error)
            return
        if state.n_cells != tokens.size or state.layout != self.layout:
            log.warning("not storing a sequence whose state does not match its tokens or layout")
            return
        order = cells_in_position_order(state)
        with self._lock:
            planned = [entry for entry in self.index.keys_for(tokens) if entry[0] not in self.index]
        for key, parent, start, end in planned:
            block_tokens = tokens[start:end].copy()
            if end - start < self.config.block_size and self._covered_by_sibling(parent, block_tokens):
                continue  # a longer stored block already holds these tokens
            payload = extract_piece(state, order, start, end)
            info = BlockInfo(key, parent, start, block_tokens, len(payload), payload_checksum(payload))
            self.ram.put(key, payload)
            self.disk.put(info, payload)
            with self._lock:
                self.index.add(info)
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
    def pin(self, tokens: list[int], pinned: bool = True) -> int:
        """Pin (or unpin) the stored blocks of this prefix so LRU and TTL pass over them."""
        self.flush()
        match = self.lookup(as_token_array(tokens))
        fetched = self.fetch(match)
        if fetched is None:
            return 0
        for info, payload in zip(fetched.blocks, fetched.payloads, strict=True):
            if info.pinned != pinned:
                self.disk.set_pinned(info, payload, pinned)
                self.ram.set_pinned(info.key, pinned)
        return len(fetched.blocks)

    def prune(self) -> int:
        return self.ram.prune() + self.disk.prune()

    def clear(self) -> int:
        self.flush()
        with self._lock:
            self.index = BlockIndex(self.config.block_size, self.namespace.seed)
        self.ram.clear()
        return self.disk.clear()

    def stats(self) -> CacheStats:
        with self._lock:
            requests = self.requests
            pinned = sum(1 for info in self.index.entries.values() if info.pinned)
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
                    "entries": len(self.ram),
                    "bytes": self.ram.bytes_used,
                    "budget_bytes": self.ram.budget_bytes,
                    **self.ram.counters.as_dict(),
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
