"""A tier in one file: entries in a dict, with faults to inject. It proves the cache takes a new tier whole."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from cache.blocks import BlockInfo, PayloadParts
from cache.keys import BlockKey
from cache.tier import Keep, Sink, Stored, keeps
from cache.tiers import ReuseTier


@dataclass
class Faults:
    """What the tier does wrong when asked."""

    damage_reads: bool = False  # hands out bytes with one flipped
    fail_reads: bool = False  # raises on every read
    fail_writes: bool = False  # raises on every put
    fail_upkeep: bool = False  # raises on everything but reads and puts


def _upkeep(faults: Faults) -> None:
    if faults.fail_upkeep:
        raise ConnectionError("the store is unreachable")


@dataclass
class MemoryTier:
    name: ReuseTier = ReuseTier.DISK
    checks_payloads: bool = False  # the chain checks what it hands out
    enabled: bool = True
    faults: Faults = field(default_factory=Faults)
    kept: dict[BlockKey, bytes] = field(default_factory=dict)
    pinned: set[BlockKey] = field(default_factory=set)
    touched: list[BlockKey] = field(default_factory=list)
    stores: int = 0  # how many `storing` blocks were opened
    keeps_asked: list[list[bool]] = field(default_factory=list)  # per read, whether each payload may be kept
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def holding(self, infos: Sequence[BlockInfo]) -> set[BlockKey]:
        _upkeep(self.faults)
        with self._lock:
            return {info.key for info in infos if info.key in self.kept}

    def read_into(self, infos: Sequence[BlockInfo], sink: Sink, *, keep: Keep) -> list[bool]:
        self.keeps_asked.append([keeps(keep, index) for index in range(len(infos))])
        if self.faults.fail_reads:
            raise ConnectionError("the store is unreachable")
        with self._lock:
            found = [self.kept.get(info.key) for info in infos]
        for number, payload in enumerate(found):
            if payload is not None:
                sink(number, b"\xff" + payload[1:] if self.faults.damage_reads and payload[:1] != b"\xff" else payload)
        return [payload is not None for payload in found]

    def put(self, info: BlockInfo, payload: Stored) -> bool:
        if self.faults.fail_writes:
            raise ConnectionError("the store is unreachable")
        data = payload.joined() if isinstance(payload, PayloadParts) else bytes(payload)
        with self._lock:
            self.kept[info.key] = data
        return True

    @contextlib.contextmanager
    def storing(self) -> Iterator[None]:
        _upkeep(self.faults)
        self.stores += 1
        yield

    def touch(self, infos: Sequence[BlockInfo]) -> None:
        _upkeep(self.faults)
        self.touched.extend(info.key for info in infos)

    def discard(self, info: BlockInfo) -> None:
        _upkeep(self.faults)
        with self._lock:
            self.kept.pop(info.key, None)

    def set_pinned(self, info: BlockInfo, payload: bytes, pinned: bool) -> None:
        _upkeep(self.faults)
        (self.pinned.add if pinned else self.pinned.discard)(info.key)

    def new_entries(self) -> list[BlockInfo]:
        _upkeep(self.faults)
        return []

    def prune(self) -> int:
        return 0

    def clear(self) -> int:
        with self._lock:
            count = len(self.kept)
            self.kept.clear()
            return count

    def stats(self) -> dict[str, object]:
        return {"entries": len(self.kept)}

    def close(self) -> None:
        pass
