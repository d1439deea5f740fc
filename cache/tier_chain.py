"""The tiers, fastest first, as one store: a read walks them, a write goes to each, a drop leaves none holding it.

What a slower tier serves, the caller may keep in the first (`first`, RAM); what a faster one serves is
marked used in the slower ones (`touch_after`), so that one recency holds over all of them. A payload
from a tier that does not check its own reads is checked here, and a tier that raises serves nothing:
a new tier can cost a hit, never a wrong restore.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence

from cache.blocks import BlockInfo, payload_checksum
from cache.keys import BlockKey
from cache.tier import Payload, Stored, Tier

log = logging.getLogger(__name__)

# Takes a payload as read: the entry's index among those asked for, the bytes, and the number of the tier that
# served it (0: the first).
ChainSink = Callable[[int, Payload, int], None]


class TierChain:
    def __init__(self, tiers: Sequence[Tier]) -> None:
        if not tiers:
            raise ValueError("a cache needs at least one tier")
        self.tiers = tuple(tiers)
        self.first = self.tiers[0]

    @property
    def keeps_beyond_first(self) -> bool:
        """Whether a tier after the first keeps anything (a disk switched off does not)."""
        return any(tier.enabled for tier in self.tiers[1:])

    def read_into(self, infos: Sequence[BlockInfo], sink: ChainSink, *, keep: bool) -> list[int | None]:
        """Hand each entry's payload to `sink` from the fastest tier that has it intact; the number of the tier
        that served each (None: none did, the entry is lost)."""
        served: list[int | None] = [None] * len(infos)
        for number in range(len(self.tiers)):
            wanted = [index for index, by in enumerate(served) if by is None]
            if not wanted:
                break

            def hand(index: int, payload: Payload, tier: int, wanted: list[int] = wanted) -> None:
                sink(wanted[index], payload, tier)
                served[wanted[index]] = tier

            self._read_tier(number, [infos[index] for index in wanted], hand, keep)
        return served

    def _read_tier(self, number: int, infos: Sequence[BlockInfo], sink: ChainSink, keep: bool) -> None:
        """`read_into` of one tier, each payload checked where the tier does not check its own."""
        tier = self.tiers[number]

        def hand(index: int, payload: Payload) -> None:
            info = infos[index]
            if not tier.checks_payloads and (
                len(payload) != info.payload_size or payload_checksum(payload) != info.checksum
            ):
                log.warning("tier %s served a damaged entry: not used", tier.name)
                return
            sink(index, payload, number)

        try:
            tier.read_into(infos, hand, keep=keep)
        except Exception:  # a tier's failure is a miss there, never a failed restore
            log.exception("tier %s could not be read", tier.name)

    def payload(self, info: BlockInfo) -> tuple[bytes | None, int | None]:
        """One entry's payload as bytes, and the number of the tier that served it (None: lost)."""
        got: list[bytes] = []

        def take(_index: int, payload: Payload, _tier: int) -> None:
            got.append(payload if isinstance(payload, bytes) else bytes(payload))

        served = self.read_into([info], take, keep=True)[0]
        return (got[0] if got else None), served

    def put(self, info: BlockInfo, payload: Stored, *, first: bool = True) -> None:
        """Keep an entry in every tier (but the first unless `first`)."""
        for tier in self.tiers if first else self.tiers[1:]:
            try:
                tier.put(info, payload)
            except Exception:
                log.exception("tier %s could not keep an entry", tier.name)

    def storing(self) -> contextlib.ExitStack[bool | None]:
        """Around the puts of one store, in every tier."""
        stack = contextlib.ExitStack()
        for tier in self.tiers:
            stack.enter_context(tier.storing())
        return stack

    def touch_after(self, number: int, infos: Sequence[BlockInfo]) -> None:
        """Mark entries tier `number` served as used in the slower tiers too."""
        for tier in self.tiers[number + 1 :]:
            tier.touch(infos)

    def holding(self, infos: Sequence[BlockInfo]) -> set[BlockKey]:
        """Which of these entries some tier keeps (each tier asked only about those the faster ones lack)."""
        held: set[BlockKey] = set()
        for tier in self.tiers:
            missing = [info for info in infos if info.key not in held]
            if not missing:
                break
            held |= tier.holding(missing)
        return held

    def discard(self, info: BlockInfo) -> None:
        for tier in self.tiers:
            tier.discard(info)

    def set_pinned(self, info: BlockInfo, payload: bytes, pinned: bool) -> None:
        """Slower tiers first: the last may move the entry, and the record then says where it is."""
        for tier in reversed(self.tiers):
            tier.set_pinned(info, payload, pinned)

    def new_entries(self) -> list[BlockInfo]:
        return [info for tier in self.tiers for info in tier.new_entries()]

    def prune(self) -> int:
        return sum(tier.prune() for tier in self.tiers)

    def clear(self) -> int:
        """Every entry dropped; how many (the fullest tier's count: the others hold copies of the same ones)."""
        return max(tier.clear() for tier in self.tiers)

    def close(self) -> None:
        for tier in self.tiers:
            tier.close()
