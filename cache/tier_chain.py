"""The tiers, fastest first, as one store: a read walks them, a write goes to each, a drop leaves none holding it.

What a slower tier serves, the caller may keep in the first (`first`, RAM); what a faster one serves is
marked used in the slower ones (`touch_after`), so that one recency holds over all of them. A payload
from a tier that does not check its own reads is checked here, and a tier that raises is taken as
holding nothing and doing nothing asked of it: a new tier can cost a hit, never a wrong restore or a
failed request. An exception from the caller's own sink is the caller's: it passes through.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TypeVar

from cache.blocks import BlockInfo, payload_checksum
from cache.keys import BlockKey
from cache.tier import Keep, Payload, Stored, Tier, keeps

log = logging.getLogger(__name__)

T = TypeVar("T")
# Takes a payload as read: the entry's index among those asked for, the bytes, and the number of the tier that
# served it (0: the first).
ChainSink = Callable[[int, Payload, int], None]


def _guarded(tier: Tier, doing: str, action: Callable[[], T], fallback: T) -> T:
    try:
        return action()
    except Exception:  # a tier's failure: a miss there, never the request's
        log.exception("tier %s failed %s", tier.name, doing)
        return fallback


def _enter(stack: contextlib.ExitStack[bool | None], tier: Tier) -> None:
    stack.enter_context(tier.storing())


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

    def read_into(self, infos: Sequence[BlockInfo], sink: ChainSink, *, keep: Keep) -> list[int | None]:
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

            kept = keep if isinstance(keep, bool) else [keeps(keep, index) for index in wanted]
            self._read_tier(number, [infos[index] for index in wanted], hand, kept)
        return served

    def _read_tier(self, number: int, infos: Sequence[BlockInfo], sink: ChainSink, keep: Keep) -> None:
        """`read_into` of one tier, each payload checked where the tier does not check its own; the sink's own
        failure raised again once the tier is done (the tier's is a miss)."""
        tier = self.tiers[number]
        failures: list[BaseException] = []

        def hand(index: int, payload: Payload) -> None:
            info = infos[index]
            if not tier.checks_payloads and (
                len(payload) != info.payload_size or payload_checksum(payload) != info.checksum
            ):
                log.warning("tier %s served a damaged entry: not used", tier.name)
                return
            try:
                sink(index, payload, number)
            except BaseException as failure:  # the caller's, raised below: not the tier's
                failures.append(failure)

        _guarded(tier, "to read", lambda: tier.read_into(infos, hand, keep=keep), None)
        if failures:
            raise failures[0]

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
            _guarded(tier, "to keep an entry", partial(tier.put, info, payload), False)

    @contextlib.contextmanager
    def storing(self) -> Iterator[None]:
        """Around the puts of one store, in every tier (one that cannot begin it stores as usual)."""
        with contextlib.ExitStack() as stack:
            for tier in self.tiers:
                _guarded(tier, "to begin a store", partial(_enter, stack, tier), None)
            yield

    def touch_after(self, number: int, infos: Sequence[BlockInfo]) -> None:
        """Mark entries tier `number` served as used in the slower tiers too."""
        for tier in self.tiers[number + 1 :]:
            _guarded(tier, "to mark entries used", partial(tier.touch, infos), None)

    def holding(self, infos: Sequence[BlockInfo]) -> set[BlockKey]:
        """Which of these entries some tier keeps (each tier asked only about those the faster ones lack)."""
        held: set[BlockKey] = set()
        for tier in self.tiers:
            missing = [info for info in infos if info.key not in held]
            if not missing:
                break
            held |= _guarded(tier, "to say what it holds", partial(tier.holding, missing), set())
        return held

    def discard(self, info: BlockInfo) -> None:
        for tier in self.tiers:
            _guarded(tier, "to drop an entry", partial(tier.discard, info), None)

    def set_pinned(self, info: BlockInfo, payload: bytes, pinned: bool) -> None:
        """Slower tiers first: the last may move the entry, and the record then says where it is."""
        for tier in reversed(self.tiers):
            _guarded(tier, "to pin", partial(tier.set_pinned, info, payload, pinned), None)

    def new_entries(self) -> list[BlockInfo]:
        nothing: list[BlockInfo] = []
        return [
            info for tier in self.tiers for info in _guarded(tier, "to list new entries", tier.new_entries, nothing)
        ]

    def prune(self) -> int:
        return sum(_guarded(tier, "to prune", tier.prune, 0) for tier in self.tiers)

    def clear(self) -> list[int]:
        """Every entry dropped; how many each tier dropped."""
        return [_guarded(tier, "to clear", tier.clear, 0) for tier in self.tiers]

    def close(self) -> None:
        for tier in self.tiers:
            _guarded(tier, "to close", tier.close, None)
