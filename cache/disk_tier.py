"""Tier "disk": block payloads in a `diskcache.Cache`, LRU under a byte budget, with TTL.

Each block is one row: the payload (raw bytes, a file once large) and, in the row's
tag, the block's metadata record, so the index is rebuilt from the tags alone at
start-up. Pinned blocks live in a second cache that is never culled. Nothing is ever
unpickled: the Disk subclass refuses pickled keys and values, since a cache file is input.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import diskcache
from diskcache.core import MODE_PICKLE

from cache.blocks import BlockInfo, RecordError, payload_checksum
from cache.stats import TierCounters

PRIVATE = 0o700
UNLIMITED = 1 << 62


class BytesOnlyDisk(diskcache.Disk):
    """diskcache storage that accepts str keys and bytes/int values, and never unpickles."""

    def put(self, key):  # type: ignore[no-untyped-def]
        if not isinstance(key, str):
            raise TypeError("cache keys are strings")
        return super().put(key)

    def get(self, key, raw):  # type: ignore[no-untyped-def]
        if not raw:
            raise RecordError("refusing a pickled key")
        return super().get(key, raw)

    def store(self, value, read, key=diskcache.core.UNKNOWN):  # type: ignore[no-untyped-def]
        if not isinstance(value, (bytes, int)) or isinstance(value, bool):
            raise TypeError("cache values are bytes or integers")
        return super().store(value, read, key=key)

    def fetch(self, mode, filename, value, read):  # type: ignore[no-untyped-def]
        if mode == MODE_PICKLE:
            raise RecordError("refusing a pickled value")
        return super().fetch(mode, filename, value, read)


def _open(directory: Path, size_limit: int) -> diskcache.Cache:
    """A private diskcache folder with LRU culling that stores only bytes."""
    directory.mkdir(mode=PRIVATE, parents=True, exist_ok=True)
    os.chmod(directory, PRIVATE)
    return diskcache.Cache(
        str(directory),
        size_limit=size_limit,
        eviction_policy="least-recently-used",
        disk=BytesOnlyDisk,
        disk_min_file_size=32 * 1024,
        cull_limit=16,
        statistics=False,
    )


class DiskTier:
    """Block payloads on disk, shared by every process and namespace using the folder."""

    def __init__(self, directory: Path, budget_bytes: int, ttl_seconds: float, namespace_id: bytes) -> None:
        self.directory = directory
        self.budget_bytes = budget_bytes
        self.ttl_seconds = ttl_seconds
        self.namespace_id = namespace_id
        self.counters = TierCounters()
        self._lock = threading.Lock()
        directory.mkdir(mode=PRIVATE, parents=True, exist_ok=True)
        self._blocks = _open(directory / "blocks", budget_bytes)
        self._pinned = _open(directory / "pinned", UNLIMITED)

    def close(self) -> None:
        self._blocks.close()
        self._pinned.close()

    def load_index(self) -> list[BlockInfo]:
        """Every live block of this namespace, from the row tags: no payload is read."""
        infos: list[BlockInfo] = []
        now = time.time()
        for store in (self._blocks, self._pinned):
            rows = store._sql(  # noqa: SLF001 - diskcache has no public way to list tags
                "SELECT tag FROM Cache WHERE raw = 1 AND tag IS NOT NULL AND (expire_time IS NULL OR expire_time > ?)",
                (now,),
            ).fetchall()
            for (tag,) in rows:
                try:
                    infos.append(BlockInfo.decode(bytes(tag), self.namespace_id))
                except RecordError:
                    continue  # another namespace's block, or a damaged record: not ours to use
        return infos

    def put(self, info: BlockInfo, payload: bytes) -> None:
        store = self._pinned if info.pinned else self._blocks
        expire = None if info.pinned else self.ttl_seconds
        store.set(info.key.hex(), payload, expire=expire, tag=info.encode(self.namespace_id))
        with self._lock:
            self.counters.bytes_written += len(payload)

    def get(self, info: BlockInfo) -> bytes | None:
        """The payload if present and intact; a damaged one is deleted and reported missing."""
        store = self._pinned if info.pinned else self._blocks
        name = info.key.hex()
        try:
            payload = store.get(name, default=None, retry=True)
        except (RecordError, OSError):
            payload = None
        with self._lock:
            if payload is None:
                # The index knew it, so diskcache culled it (LRU) or it expired.
                self.counters.misses += 1
                self.counters.evictions += 1
                return None
            if not isinstance(payload, bytes) or len(payload) != info.payload_size or payload_checksum(payload) != info.checksum:
                self.counters.misses += 1
                store.delete(name, retry=True)
                return None
            self.counters.hits += 1
            self.counters.bytes_read += len(payload)
        if not info.pinned:
            store.touch(name, expire=self.ttl_seconds, retry=True)
        return payload

    def delete(self, info: BlockInfo) -> None:
        for store in (self._blocks, self._pinned):
            store.delete(info.key.hex(), retry=True)

    def set_pinned(self, info: BlockInfo, payload: bytes, pinned: bool) -> None:
        """Move a block between the culled and the never-culled store."""
        source, target = (self._blocks, self._pinned) if pinned else (self._pinned, self._blocks)
        info.pinned = pinned
        target.set(info.key.hex(), payload, expire=None if pinned else self.ttl_seconds, tag=info.encode(self.namespace_id))
        source.delete(info.key.hex(), retry=True)

    def prune(self) -> int:
        """Drop expired rows now; return how many."""
        removed = self._blocks.expire(retry=True)
        with self._lock:
            self.counters.expirations += removed
        return removed

    def clear(self) -> int:
        return self._blocks.clear(retry=True) + self._pinned.clear(retry=True)

    def sizes(self) -> dict[str, int]:
        """Entries and bytes on disk (all namespaces), pinned included."""
        entries = len(self._blocks) + len(self._pinned)
        return {"entries": entries, "bytes": self._blocks.volume() + self._pinned.volume(), "pinned_entries": len(self._pinned)}
