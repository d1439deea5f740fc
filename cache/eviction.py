"""Which kept block to evict next: one policy object per tier, shared with the bench's trace replay.

- `LruPolicy`: the least recently used block first (the RAM tier's behaviour before policies).
- `LfuPolicy`: the block used fewest times first, ties going to the least recently used.
- `ValuePolicy`: the block whose loss costs least per byte it frees, and only a leaf of the
  prefix tree (a block none of whose children are kept): a child is worthless without its
  parent, so a parent goes only after its children.

A policy never chooses a pinned block; TTL expiry stays with the tier. The tier tells its policy
what it keeps and uses and asks for a victim while it is over budget; the tier's lock guards the
policy, which is not thread-safe itself. Every call is O(log n) amortised (heaps whose stale
entries are skipped when they reach the top), so 10,000s of blocks cost no full sort.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from cache.keys import BlockKey

# The attention-cost constant k of the compute model: a token at position p costs 1 + p / k, so at
# k tokens of context a token costs twice what it does at the start (feed-forward work per token is
# constant; attention over the p tokens before it grows linearly). Small models on a CPU cross over
# at a few thousand tokens.
ATTENTION_TOKENS = 4096.0
# How fast a block's uses are forgotten: a use this long ago counts half as much as one now. An
# hour lets a document asked about by several sessions outlast a finished conversation, while a
# block used in a burst long ago still gives way to what is in use now (on the bench's traces,
# G, six hours or more let stale bursts crowd out fresh history: far below LRU). That is the most:
# a tier that keeps an unused block only minutes (a tight budget) must forget uses faster, or the
# blocks popular an hour ago crowd out the conversation going on now (on G's zipf trace at 40
# blocks, an hour's half-life reused 21% of prompt tokens where LRU reused 44%). So by default the
# half-life is this share of how long the tier keeps a block unused before evicting it (a running
# geometric mean), at most VALUE_HALF_LIFE_S.
VALUE_HALF_LIFE_S = 3600.0
HALF_LIFE_SHARE_OF_IDLE = 1 / 4
MIN_HALF_LIFE_S = 5.0
HALF_LIFE_EVICTIONS = 64  # evictions between looks at the half-life (and the running mean's weight)
POLICY_NAMES = ("value", "lru", "lfu")
# The value policy remembers the uses of this many evicted blocks per kept one (at least GHOSTS_MIN),
# so a block evicted and needed again comes back with its history instead of as a stranger.
GHOSTS_PER_BLOCK = 2
GHOSTS_MIN = 4096


def recompute_cost(start: int, tokens: int, attention_tokens: float = ATTENTION_TOKENS) -> float:
    """Token-times to compute `tokens` tokens after `start` tokens: the sum of 1 + p / k over their positions.

    That is tokens * (1 + (start + (tokens - 1) / 2) / k): a block deep in a long prompt costs more
    than the same number of tokens at its start.
    """
    return tokens * (1.0 + (start + (tokens - 1) / 2) / attention_tokens)


@dataclass(frozen=True)
class BlockPlace:
    """Where a block sits in the prefix tree: what a policy needs to weigh its loss."""

    parent: BlockKey | None  # None (or the root key) for a first block
    start: int  # tokens before it
    tokens: int  # tokens it holds


class EvictionPolicy(Protocol):
    """What a tier tells its policy, and the one question it asks: which block goes next."""

    name: str

    def admit(self, key: BlockKey, place: BlockPlace, size: int, now: float, pinned: bool = False) -> None:
        """The tier keeps `key` now (stored again: a use)."""

    def touch(self, key: BlockKey, now: float) -> None:
        """A kept block was used (a hit)."""

    def forget(self, key: BlockKey) -> None:
        """The tier no longer keeps `key` (evicted, expired or discarded); unknown keys are ignored."""

    def set_pinned(self, key: BlockKey, pinned: bool) -> None: ...

    def victim(self) -> BlockKey | None:
        """The block to evict next (still kept until `forget`); None when every block is pinned or held."""

    def clear(self) -> None: ...


class LruPolicy:
    """Least recently used first; pinned blocks keep their place and are passed over."""

    name = "lru"

    def __init__(self) -> None:
        self._order: OrderedDict[BlockKey, bool] = OrderedDict()  # key -> pinned, least recent first

    def admit(self, key: BlockKey, place: BlockPlace, size: int, now: float, pinned: bool = False) -> None:
        self._order[key] = pinned
        self._order.move_to_end(key)

    def touch(self, key: BlockKey, now: float) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def forget(self, key: BlockKey) -> None:
        self._order.pop(key, None)

    def set_pinned(self, key: BlockKey, pinned: bool) -> None:
        if key in self._order:
            self._order[key] = pinned

    def victim(self) -> BlockKey | None:
        return next((key for key, pinned in self._order.items() if not pinned), None)

    def clear(self) -> None:
        self._order.clear()


class LazyHeap:
    """Keys by priority, lowest first; a key pushed again or discarded leaves a stale entry, skipped at the top.

    Stale entries are swept once they outnumber live ones, so the heap stays O(live keys).
    """

    def __init__(self) -> None:
        # An entry is (priority, tie-break, push count, key); the live one of a key is the very tuple
        # in the heap, so a stale entry is told by identity, not compared field by field.
        self._heap: list[tuple[float, float, int, BlockKey]] = []
        self._live: dict[BlockKey, tuple[float, float, int, BlockKey]] = {}
        self._counter = itertools.count()

    def __len__(self) -> int:
        return len(self._live)

    @property
    def entries(self) -> int:
        """Entries held, stale ones included (at most about twice the live keys)."""
        return len(self._heap)

    def push(self, key: BlockKey, first: float, second: float = 0.0, order: int | None = None) -> None:
        """`order` breaks ties (lowest first; by default, the order of pushes)."""
        entry = (first, second, next(self._counter) if order is None else order, key)
        self._live[key] = entry
        heapq.heappush(self._heap, entry)
        if len(self._heap) > 2 * len(self._live) + 64:
            self._heap = list(self._live.values())
            heapq.heapify(self._heap)

    def discard(self, key: BlockKey) -> None:
        self._live.pop(key, None)

    def rank_of(self, key: BlockKey) -> tuple[float, float, int]:
        """The priority and tie-break `key` was last pushed with (it must be in the heap)."""
        first, second, order, _ = self._live[key]
        return first, second, order

    def peek(self) -> BlockKey | None:
        heap, live = self._heap, self._live
        while heap:
            entry = heap[0]
            if live.get(entry[3]) is entry:
                return entry[3]
            heapq.heappop(heap)
        return None

    def clear(self) -> None:
        self._heap.clear()
        self._live.clear()


class _Record(Protocol):
    pinned: bool
    order: int  # when it was last used, in uses: ties go to the least recently used


RecordT = TypeVar("RecordT", bound=_Record)


class _HeapPolicy(Generic[RecordT]):
    """A policy that keeps one record per block and offers unpinned ones to a heap, worst first.

    A use only ever raises a block's rank, so a touch leaves its heap entry where it was: when that
    entry reaches the top it is pushed again at the rank its record gives now. Every other entry's
    rank is at most its record's, so the first whose rank is current is the true worst; and a hit
    (most of a tier's calls) costs no heap push."""

    def __init__(self) -> None:
        self._blocks: dict[BlockKey, RecordT] = {}
        self._heap = LazyHeap()
        self._uses = itertools.count()

    def set_pinned(self, key: BlockKey, pinned: bool) -> None:
        record = self._blocks.get(key)
        if record is not None:
            record.pinned = pinned
            self._offer(key)

    def victim(self) -> BlockKey | None:
        while (key := self._heap.peek()) is not None:
            record = self._blocks[key]
            rank = self._rank(record)
            if not self._heap.rank_of(key) < (*rank, record.order):  # current (a NaN rank included: no loop)
                return key
            self._heap.push(key, *rank, order=record.order)  # used since it was pushed: where it ranks now
        return None

    def clear(self) -> None:
        self._blocks.clear()
        self._heap.clear()

    def _offer(self, key: BlockKey) -> None:
        """Put `key` in the heap where its record now ranks it (or out of it, while it cannot go)."""
        record = self._blocks[key]
        if self._held(key, record):
            self._heap.discard(key)
        else:
            self._heap.push(key, *self._rank(record), order=record.order)

    def _rank(self, record: RecordT) -> tuple[float, float]:
        """Lowest goes first; a use never lowers it."""
        raise NotImplementedError

    def _held(self, key: BlockKey, record: RecordT) -> bool:
        """Not a candidate now (pinned)."""
        return record.pinned


@dataclass(slots=True)
class _Uses:
    count: float
    last: float
    pinned: bool
    order: int


class LfuPolicy(_HeapPolicy[_Uses]):
    """Fewest uses first (uses are never forgotten), ties going to the least recently used."""

    name = "lfu"

    def admit(self, key: BlockKey, place: BlockPlace, size: int, now: float, pinned: bool = False) -> None:
        uses = self._blocks.get(key)
        if uses is None:
            self._blocks[key] = _Uses(1, now, pinned, next(self._uses))
        else:
            uses.count, uses.last, uses.pinned, uses.order = uses.count + 1, now, pinned, next(self._uses)
        self._offer(key)

    def touch(self, key: BlockKey, now: float) -> None:
        uses = self._blocks.get(key)
        if uses is not None:  # a higher rank: its heap entry waits (`victim`)
            uses.count, uses.last, uses.order = uses.count + 1, now, next(self._uses)

    def forget(self, key: BlockKey) -> None:
        if self._blocks.pop(key, None) is not None:
            self._heap.discard(key)

    def _rank(self, record: _Uses) -> tuple[float, float]:
        return record.count, record.last


@dataclass(slots=True)
class _Worth:
    parent: BlockKey | None
    cost_per_byte: float  # recompute cost over payload bytes
    uses: float  # decayed: each use counts 2^(-age / half-life)
    last: float
    pinned: bool
    order: int


class ValuePolicy(_HeapPolicy[_Worth]):
    """Evict the leaf worth least: recompute cost x decayed uses / bytes.

    A block's value at time t is cost(start, tokens) / size x sum over its uses of
    2^(-(t - use) / half-life): what recomputing it would cost (`recompute_cost`: later positions
    cost more), times how often it was used lately, per byte its eviction frees. Every value
    decays by the same factor over time, so the order of two untouched blocks never changes and
    each block's heap key is fixed between its uses: ln(value at its last use) + last use x
    ln 2 / half-life. Only leaves are candidates: a block with a kept child waits for it.

    `half_life_s` None (the default): the half-life follows how long this tier keeps an unused
    block (see VALUE_HALF_LIFE_S), looked at every HALF_LIFE_EVICTIONS evictions; when it moves
    by a quarter or more the heap is keyed again (the order of untouched blocks depends on it).
    """

    name = "value"

    def __init__(self, half_life_s: float | None = None, attention_tokens: float = ATTENTION_TOKENS) -> None:
        if (half_life_s is not None and half_life_s <= 0) or attention_tokens <= 0:
            raise ValueError("the half-life and the attention constant must be positive")
        self.adaptive = half_life_s is None
        self.half_life_s = VALUE_HALF_LIFE_S if half_life_s is None else half_life_s
        self.attention_tokens = attention_tokens
        super().__init__()
        self._rate = math.log(2) / self.half_life_s
        self._kept_children: dict[BlockKey, int] = {}
        self._ghosts: OrderedDict[BlockKey, tuple[float, float]] = OrderedDict()  # evicted: uses, last use
        self._clock = -math.inf  # the latest use seen
        self._idle_log: float | None = None  # running mean of ln(1 + seconds unused) of the blocks evicted
        self._evictions = 0

    def admit(self, key: BlockKey, place: BlockPlace, size: int, now: float, pinned: bool = False) -> None:
        if now > self._clock:
            self._clock = now
        worth = self._blocks.get(key)
        if worth is not None:
            worth.pinned = pinned
            self.touch(key, now)
            self._offer(key)  # pinned or not now
            return
        cost = recompute_cost(place.start, max(place.tokens, 1), self.attention_tokens)
        uses = 1.0
        remembered = self._ghosts.pop(key, None)
        if remembered is not None:
            past_uses, past_last = remembered
            uses += past_uses * math.exp(-self._rate * max(now - past_last, 0.0))
        self._blocks[key] = _Worth(place.parent, cost / max(size, 1), uses, now, pinned, next(self._uses))
        if place.parent is not None:
            children = self._kept_children.get(place.parent, 0)
            self._kept_children[place.parent] = children + 1
            if children == 0:
                self._heap.discard(place.parent)  # no longer a leaf
        self._offer(key)

    def touch(self, key: BlockKey, now: float) -> None:
        if now > self._clock:
            self._clock = now
        worth = self._blocks.get(key)
        if worth is None:
            return
        if now > worth.last:  # (a use from before the last one, another process's clock, decays nothing)
            worth.uses = worth.uses * math.exp(-self._rate * (now - worth.last)) + 1.0
            worth.last = now
        else:
            worth.uses += 1.0
        worth.order = next(self._uses)
        # Its value rose: its heap entry waits until it reaches the top (`victim`).

    def forget(self, key: BlockKey) -> None:
        worth = self._blocks.pop(key, None)
        if worth is None:
            return
        self._heap.discard(key)
        self._ghosts[key] = (worth.uses, worth.last)
        while len(self._ghosts) > max(GHOSTS_MIN, GHOSTS_PER_BLOCK * len(self._blocks)):
            self._ghosts.popitem(last=False)
        parent = worth.parent
        if parent is None:
            return
        children = self._kept_children.get(parent, 0) - 1
        if children > 0:
            self._kept_children[parent] = children
            return
        self._kept_children.pop(parent, None)
        if parent in self._blocks:
            self._offer(parent)  # a leaf again

    def clear(self) -> None:
        super().clear()
        self._kept_children.clear()
        self._ghosts.clear()

    def victim(self) -> BlockKey | None:
        key = super().victim()
        if key is not None and self.adaptive:
            self._learn_idle(self._clock - self._blocks[key].last)
        return key

    def _learn_idle(self, idle_s: float) -> None:
        """Fold in how long an evicted block was unused; every HALF_LIFE_EVICTIONS, follow it."""
        sample = math.log1p(max(idle_s, 0.0))
        if self._idle_log is None:
            self._idle_log = sample
        else:
            self._idle_log += (sample - self._idle_log) / HALF_LIFE_EVICTIONS
        self._evictions += 1
        if self._evictions % HALF_LIFE_EVICTIONS:
            return
        wanted = math.expm1(self._idle_log) * HALF_LIFE_SHARE_OF_IDLE
        wanted = min(max(wanted, MIN_HALF_LIFE_S), VALUE_HALF_LIFE_S)
        if abs(math.log(wanted / self.half_life_s)) >= math.log(1.25):
            self.half_life_s = wanted
            self._rate = math.log(2) / wanted
            self._heap.clear()
            for block in self._blocks:
                self._offer(block)

    def value(self, key: BlockKey, now: float) -> float:
        """The block's value now, in token-times per byte (0 for an unknown block)."""
        worth = self._blocks.get(key)
        if worth is None:
            return 0.0
        return worth.cost_per_byte * worth.uses * math.exp(-self._rate * max(now - worth.last, 0.0))

    def _rank(self, record: _Worth) -> tuple[float, float]:
        return math.log(record.cost_per_byte * record.uses) + self._rate * record.last, 0.0

    def _held(self, key: BlockKey, record: _Worth) -> bool:
        return record.pinned or key in self._kept_children  # a parent waits for its children


def make_policy(name: str) -> EvictionPolicy:
    """A fresh policy by its name in `POLICY_NAMES`."""
    if name == "lru":
        return LruPolicy()
    if name == "lfu":
        return LfuPolicy()
    if name == "value":
        return ValuePolicy()
    raise ValueError(f"unknown eviction policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")
