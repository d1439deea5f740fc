"""A slow, obvious replay of the sizing model (cache/sizing.py) at one set of budgets, and random logs to run it on.

The replay keeps an LRU list of entries for the disk and one per process for RAM, evicts from the
old end while over budget, drops entries unused for the TTL, and answers each request as the
sizing docstring says. Mattson's one pass must agree with it at every budget.
"""

from __future__ import annotations

import random
from collections import OrderedDict

import numpy as np

from cache.request_log import LoggedEvent, LoggedRequest, LoggedStore
from cache.tiers import ReuseTier


class _Lru:
    def __init__(self, budget: float, ttl: float) -> None:
        self.budget, self.ttl = budget, ttl
        self.kept: OrderedDict[int, tuple[int, float]] = OrderedDict()  # key -> (size, last use)
        self.used = 0

    def expire(self, now: float) -> None:
        for key, (size, last) in list(self.kept.items()):
            if now - last > self.ttl:
                del self.kept[key]
                self.used -= size

    def use(self, key: int, size: int, now: float) -> None:
        if key in self.kept:
            self.used -= self.kept.pop(key)[0]
        self.kept[key] = (size, now)
        self.used += size
        while self.used > self.budget and self.kept:
            _, (old, _) = self.kept.popitem(last=False)
            self.used -= old


def replay_reused(events: list[LoggedEvent], ram_budget: float, disk_budget: float, ttl: float) -> int:
    """Reused tokens over the log's requests at these budgets (tier "any" of `RequestHistory.gains`)."""
    disk = _Lru(disk_budget, ttl)
    rams: dict[int, _Lru] = {}
    sizes: dict[int, int] = {}
    stored: set[int] = set()
    reused = 0
    for event in sorted(events, key=lambda event: event.time):
        ram = rams.setdefault(event.session, _Lru(ram_budget, ttl))
        disk.expire(event.time)
        ram.expire(event.time)
        if isinstance(event, LoggedStore):
            for key, size in zip(event.keys.tolist()[::-1], event.sizes.tolist()[::-1], strict=True):
                sizes[key] = size
                stored.add(key)
                disk.use(key, size, event.time)
                ram.use(key, size, event.time)
            continue
        reused += _reuse(event, lambda key: key in disk.kept or key in ram.kept)  # noqa: B023
        for key in _touched(event):
            if key in stored:
                disk.use(key, sizes[key], event.time)
                ram.use(key, sizes[key], event.time)
    return reused


def _reuse(request: LoggedRequest, kept: object) -> int:
    assert callable(kept)
    limit = min(request.limit, request.prompt_tokens)
    chain = request.chain.tolist()
    run = 0  # chain blocks kept from the start
    while run < len(chain) and run * request.block_size < limit and kept(chain[run]):
        run += 1
    # Marks: checkpoints (the only restorable points of such a model) or stored blocks matched in part.
    ends = [
        int(end)
        for key, end in zip(request.checkpoint_keys.tolist(), request.checkpoint_ends.tolist(), strict=True)
        if end <= limit and kept(key) and (request.without_blocks or run >= end // request.block_size)
    ]
    cache = max(ends, default=0)
    if not request.at_checkpoints:
        cache = max(cache, min(run * request.block_size, request.prompt_tokens, limit))
    return max(min(request.in_place, request.prompt_tokens), cache)


def _touched(request: LoggedRequest) -> list[int]:
    limit = min(request.limit, request.prompt_tokens)
    chain = [
        key
        for index, key in enumerate(request.chain.tolist())
        if index * request.block_size < limit
        and min((index + 1) * request.block_size, request.prompt_tokens) > request.in_place
    ]
    pairs = sorted(zip(request.checkpoint_ends.tolist(), request.checkpoint_keys.tolist(), strict=True))
    marks = [key for end, key in pairs if request.in_place < end <= limit]
    return marks[::-1] + chain[::-1]


def random_log(
    seed: int, requests: int = 60, at_checkpoints: bool = False, without_blocks: bool = False
) -> list[LoggedEvent]:
    """Requests on random paths of a small prefix tree, with stores of some of their blocks after them."""
    rng = random.Random(seed)
    block = 4
    sessions = [rng.getrandbits(32) for _ in range(rng.randint(1, 3))]
    paths = [tuple(rng.randrange(3) for _ in range(rng.randint(1, 6))) for _ in range(8)]
    size_of: dict[int, int] = {}
    names: dict[tuple[object, ...], int] = {}

    def named(name: tuple[object, ...], sizes: list[int]) -> int:
        value = names.setdefault(name, 1000 + 7919 * len(names))
        size_of.setdefault(value, rng.choice(sizes))
        return value

    def key(path: tuple[int, ...]) -> int:
        return named(("block", path), [10, 20, 40])

    def mark(path: tuple[int, ...], extra: int) -> int:
        return named(("mark", path, extra), [5, 30])

    events: list[LoggedEvent] = []
    now = 0.0
    for _ in range(requests):
        now += rng.choice([1.0, 2.0, 5.0, 50.0])
        session = rng.choice(sessions)
        path = rng.choice(paths)[: rng.randint(1, 6)]
        prompt = len(path) * block - rng.randint(0, block - 1)
        chain = [key(path[: depth + 1]) for depth in range(len(path))]
        marks = [(mark(path[: prompt // block], extra), prompt // block * block + extra) for extra in range(2)]
        marks = [(k, end) for k, end in marks if end <= prompt]
        events.append(
            LoggedRequest(
                now,
                session,
                prompt,
                max(0, prompt - rng.randint(0, 5)),
                rng.choice([0, 0, block, 2 * block + 1]),
                0,
                ReuseTier.NONE,
                at_checkpoints,
                block,
                10.0,
                np.array(chain, dtype=np.uint64),
                np.array([k for k, _ in marks], dtype=np.uint64),
                np.array([end for _, end in marks], dtype=np.uint32),
                without_blocks,
            )
        )
        now += 0.5
        first = rng.randint(0, len(chain))
        entries = [(k, depth * block, block) for depth, k in enumerate(chain)][first:] if not without_blocks else []
        if marks and rng.random() < 0.7:
            k, end = rng.choice(marks)
            if not at_checkpoints:
                # A block matched in part ends the sequence stored with it: no block after it.
                entries = [entry for entry in entries if entry[1] < end - end % block]
            entries.append((k, end - end % block, end % block))
        if entries:
            events.append(
                LoggedStore(
                    now,
                    session,
                    np.array([k for k, _, _ in entries], dtype=np.uint64),
                    np.zeros(len(entries), dtype=np.uint64),
                    np.array([start for _, start, _ in entries], dtype=np.uint32),
                    np.array([tokens for _, _, tokens in entries], dtype=np.uint32),
                    np.array([size_of[k] for k, _, _ in entries], dtype=np.uint64),
                    np.array([at_checkpoints and tokens != block for _, _, tokens in entries], dtype=bool),
                )
            )
    return events
