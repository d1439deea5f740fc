"""What the cache holds: the index of its entries and the tiers that keep them, under one lock.

The lookup, the writer and the pins share this: each asks it which entries are stored, reads
them, and forgets those no tier keeps any more. Checkpoint deltas are resolved here too, since
each of them reads, restores and stores through the base it extends.
"""

from __future__ import annotations

import logging
import threading

import numpy as np

from cache.blocks import BlockInfo
from cache.index import BlockIndex
from cache.keys import BlockKey
from cache.request_recorder import RequestRecorder
from cache.state_format import MemoryLayout, StateFormatError, join_checkpoint
from cache.tier_chain import TierChain

log = logging.getLogger(__name__)


class Entries:
    def __init__(self, index: BlockIndex, tiers: TierChain, recorder: RequestRecorder, layout: MemoryLayout) -> None:
        self.index = index
        self.tiers = tiers
        self.recorder = recorder
        self.layout = layout
        self.lock = threading.RLock()  # over the index and the recorder; under it only RAM is called, never disk

    def learn_new(self) -> None:
        """Index what other processes (or our writer) stored since the last look."""
        news = self.tiers.new_entries()  # outside the lock: a disk query
        with self.lock:
            self.absorb(news)

    def absorb(self, news: list[BlockInfo]) -> None:
        """Index entries a tier found (under the lock)."""
        for info in news:
            known = self.index.get(info.key)
            if known is not None and (known.checksum, known.pinned) != (info.checksum, info.pinned):
                # Stored again (or pinned) by another process since: its record is current,
                # and a copy of the old bytes in RAM must not be served under it.
                self.index.remove(info.key)
                self.tiers.first.discard(known)
            self.index.add(info)
            self.recorder.remember(info)

    def added(self, info: BlockInfo) -> None:
        """Index an entry just stored."""
        with self.lock:
            self.index.add(info)
            self.recorder.remember(info)

    def forget(self, info: BlockInfo) -> None:
        """Out of the index and every tier."""
        with self.lock:
            self.index.remove(info.key)
        self.tiers.discard(info)

    def drop_lost(self, known: list[BlockInfo]) -> set[BlockKey]:
        """Forget the indexed entries no tier keeps any more, and return their keys: RAM evicted them and a
        disk cull took them (here or in another process), which the index learns only here or when a fetch
        misses. Forgotten, they are stored again when computed again, as sizing advice counts: else a popular
        prefix lost once stays lost while the index names it. One query per slower tier, for those the faster
        ones lack; a record another process replaced meanwhile is current and stays."""
        held = self.tiers.holding(known) if known else set()
        lost: set[BlockKey] = set()
        with self.lock:
            for info in known:
                if info.key not in held and self.index.get(info.key) is info:
                    self.index.remove(info.key)
                    lost.add(info.key)
        return lost

    def payload(self, info: BlockInfo) -> tuple[bytes | None, int]:
        """An entry's payload and the number of the tier that served it (one after the first: kept in the first
        now); a lost entry is forgotten."""
        payload, served = self.tiers.payload(info)
        if payload is None or served is None:
            self.forget(info)
            return None, 0
        if served:
            self.tiers.first.put(info, payload)
        return payload, served

    def keep_read(self, info: BlockInfo, payload: bytes | np.ndarray) -> None:
        """The first tier keeps an entry a slower one served, unless forgotten, stored again or pinned since: as
        the index says now."""
        with self.lock:
            current = self.index.get(info.key)
        if current is not None and current.checksum == info.checksum:
            if isinstance(payload, np.ndarray):
                payload.flags.writeable = False
            self.tiers.first.put(current, payload)

    def deepest_restorable(self, tokens: np.ndarray, limit: int) -> BlockInfo | None:
        """The deepest checkpoint of `tokens` at or before `limit` that can be restored: a whole
        one, or a delta on a whole one still stored. Deltas whose base is gone are forgotten."""
        orphans: list[BlockInfo] = []
        with self.lock:
            while True:
                found = self.index.deepest_checkpoint(tokens, limit)
                if found is None or found.extends is None:
                    break
                if self.base_of(found) is not None:
                    break
                self.index.remove(found.key)
                orphans.append(found)
        for orphan in orphans:
            # Forgotten here only: its base may just be unknown to this process yet, and its
            # record on disk ages out like any other.
            self.tiers.first.discard(orphan)
        return found

    def base_of(self, delta: BlockInfo) -> BlockInfo | None:
        """The whole checkpoint `delta` was built on, if the index holds it with the same bytes."""
        base = self.index.checkpoints.get(delta.extends) if delta.extends is not None else None
        if base is None or base.extends is not None or base.checksum != delta.extends_checksum:
            return None  # gone, stored again as a delta itself, or stored again with other bytes
        return base

    def checkpoint_of(self, info: BlockInfo) -> tuple[bytes, int, list[BlockInfo]] | None:
        """A checkpoint's whole payload (a delta joined to its base), the number of the slowest tier read for it,
        and the entries the first tier served; None when it is lost."""
        payload, served = self.payload(info)
        if payload is None:
            return None
        from_first = [] if served else [info]
        if info.extends is None:
            return payload, served, from_first
        joined, base_served = self._joined_delta(info, payload)
        if joined is None:
            return None
        if not base_served:
            with self.lock:
                base = self.base_of(info)
            from_first.extend([base] if base is not None else [])
        return joined, max(served, base_served), from_first

    def _joined_delta(self, delta: BlockInfo, tail: bytes) -> tuple[bytes | None, int]:
        """The full checkpoint of a delta (and the number of the tier that served its base); None, and the
        delta forgotten, when the checkpoint it extends is gone or does not join."""
        with self.lock:
            base = self.base_of(delta)
        payload, served = self.payload(base) if base is not None else (None, 0)
        if base is None or payload is None:
            # Forgotten by this process only: another one may hold the base it was built on.
            with self.lock:
                self.index.remove(delta.key)
            self.tiers.first.discard(delta)
            return None, 0
        try:
            return join_checkpoint(self.layout, payload, base.end, tail, delta.end), served
        except StateFormatError as error:
            log.warning("dropping a checkpoint that does not restore: %s", error)
            self.forget(delta)
            return None, 0
