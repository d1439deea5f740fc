"""Sizing advice: Mattson's one pass agrees with a plain LRU replay of the same model at every budget."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from cache.ram_replay import replay_ram
from cache.request_log import LoggedEvent, LoggedRequest, LoggedStore, columns_of
from cache.sizing import NEVER, RequestHistory
from cache.tiers import ReuseTier
from chatapp.benchmark.traces import make_trace
from tests.cache.sizing_reference import random_log, replay_reused

BUDGETS = [0, 10, 25, 40, 70, 120, 250, 1000, math.inf]


@pytest.mark.parametrize(
    "memory", [(False, False), (True, False), (True, True)], ids=["blocks", "checkpoints", "recurrent"]
)
@pytest.mark.parametrize("seed", range(12))
def test_one_pass_agrees_with_a_replay_at_every_budget(seed: int, memory: tuple[bool, bool]) -> None:
    at_checkpoints, without_blocks = memory
    events = random_log(seed, at_checkpoints=at_checkpoints, without_blocks=without_blocks)
    history = RequestHistory(columns_of(events))
    for ttl in (math.inf, 30.0):
        for ram in (0, 40, 250):
            gains = history.gains(ttl, ram_budget=ram)
            for disk in BUDGETS:
                assert gains.reused_at(disk) == replay_reused(events, ram, disk, ttl), (ttl, ram, disk)


def _request(when: float, chain: list[int], reused: int, tier: ReuseTier = ReuseTier.DISK) -> LoggedRequest:
    empty = np.zeros(0, dtype=np.uint64)
    return LoggedRequest(
        when, 1, 64 * len(chain), 64 * len(chain), 0, reused, tier, False, 64, 5.0,
        np.array(chain, dtype=np.uint64), empty, np.zeros(0, dtype=np.uint32),
    )  # fmt: skip


def _store(when: float, keys: list[int], bytes_per_block: int = 6400) -> LoggedStore:
    count = len(keys)
    return LoggedStore(
        when, 1, np.array(keys, dtype=np.uint64), np.zeros(count, dtype=np.uint64), np.zeros(count, dtype=np.uint32),
        np.full(count, 64, dtype=np.uint32), np.full(count, bytes_per_block, dtype=np.uint64), np.zeros(count, bool),
    )  # fmt: skip


def test_what_was_stored_before_the_log_began_counts_from_the_requests_that_restored_it() -> None:
    """A log rotated away, or a cache filled before the log existed: the first request restored two blocks
    no logged store holds; they are taken as stored at the log's start, at its bytes per token."""
    whole: list[LoggedEvent] = [
        _store(0.0, [11, 12]),
        _request(1.0, [11, 12, 13], 128),
        _store(1.5, [13]),
        _request(2.0, [11, 12, 13], 192),
    ]
    without_first_store = whole[1:]
    budgets = [6400, 2 * 6400, 3 * 6400, math.inf]
    curves = [
        RequestHistory(columns_of(events)).gains(math.inf).reused_curve(budgets)
        for events in (whole, without_first_store)
    ]
    assert curves[0] == curves[1]
    assert curves[0][-1] == 128 + 192
    assert curves[0][0] < curves[0][-1]
    never_restored: list[LoggedEvent] = [_request(1.0, [11, 12, 13], 0, ReuseTier.NONE), _store(1.5, [11, 12, 13])]
    assert RequestHistory(columns_of(never_restored)).gains(math.inf).reused_at(math.inf) == 0


def test_random_process_ids_give_the_figures_small_ones_do() -> None:
    """Each `chatapp ask` is a process of its own, with a random 32-bit id: they must not overflow the counting."""
    trace = make_trace("zipf", scale=2.0)
    rng = np.random.default_rng(5)
    events: list[LoggedEvent] = []
    stored: set[int] = set()
    for when, chain in zip(trace.times, trace.chains, strict=True):
        session = int(rng.integers(1 << 31, 1 << 32))
        request = _request(when, [block + 1 for block in chain], 0, ReuseTier.NONE)
        events.append(replace(request, session=session))
        new = [block + 1 for block in chain if block not in stored]
        stored.update(chain)
        if new:
            events.append(replace(_store(when + 0.5, new), session=session))
    small = [replace(event, session=index % 7) for index, event in enumerate(events)]
    budgets = [64 * 6400, 4096 * 6400, math.inf]
    for ram in (0, 256 * 6400):
        big_ids = RequestHistory(columns_of(events), sample_rate=1.0).gains(math.inf, ram_budget=ram)
        assert big_ids.reused_curve(budgets)[-1] > 0
        ram_only = RequestHistory(columns_of(events), sample_rate=1.0).gains(math.inf, tier="ram")
        assert ram_only.reused_at(math.inf) <= big_ids.reused_at(math.inf)
    rebuilt = RequestHistory(columns_of(small), sample_rate=1.0).gains(math.inf, ram_budget=0)
    assert RequestHistory(columns_of(events), sample_rate=1.0).gains(math.inf, ram_budget=0).reused_curve(
        budgets
    ) == rebuilt.reused_curve(budgets)


@pytest.mark.parametrize("seed", range(4))
def test_a_sample_of_requests_that_match_blocks_in_part_stays_within_the_prompt(seed: int) -> None:
    """A block matched in part is the best of two points: a sample cannot scale it, so it is left out, never
    counted once per sampled block (that gave more than 100% of the prompt)."""
    events = random_log(seed, requests=400)
    history = RequestHistory(columns_of(events), sample_rate=1.0)
    whole = history.gains(math.inf).reused_at(math.inf)
    for rate in (0.5, 0.2):
        estimate = RequestHistory(columns_of(events), sample_rate=rate).gains(math.inf).reused_at(math.inf)
        assert 0 < estimate <= history.prompt_tokens
    assert 0 < whole <= history.prompt_tokens


def test_a_sample_is_scaled_to_the_exact_reuse_of_an_unlimited_cache() -> None:
    """A ratio estimate: whichever popular blocks the sample holds, its curve ends where the whole log's does."""
    trace = make_trace("zipf", scale=0.3)
    events: list[LoggedEvent] = []
    stored: set[int] = set()
    for when, chain in zip(trace.times, trace.chains, strict=True):
        events.append(_request(when, [block + 1 for block in chain], 0, ReuseTier.NONE))
        new = [block + 1 for block in chain if block not in stored]
        stored.update(chain)
        if new:
            events.append(_store(when + 0.5, new))
    log = columns_of(events)
    budgets = [64 * 6400, 1024 * 6400, math.inf]
    # With a RAM tier too: its budget is in the whole log's bytes, the sample's distances in the sample's;
    # under the value policy, LRU's pass plus the policy's difference replayed on an eighth of the sample.
    for ram, policy in ((None, "lru"), (128 * 6400, "lru"), (128 * 6400, "value")):
        whole = RequestHistory(log, sample_rate=1.0).gains(math.inf, ram_budget=ram, ram_policy=policy)
        for rate in (0.3, 0.1):
            sampled = RequestHistory(log, sample_rate=rate).gains(math.inf, ram_budget=ram, ram_policy=policy)
            assert sampled.reused_at(math.inf) == pytest.approx(whole.reused_at(math.inf), abs=1)
            for exact, estimate in zip(whole.reused_curve(budgets), sampled.reused_curve(budgets), strict=True):
                assert abs(exact - estimate) <= 0.05 * whole.reused_at(math.inf), (ram, policy, rate)


@pytest.mark.parametrize("at_checkpoints", [False, True], ids=["blocks", "checkpoints"])
@pytest.mark.parametrize("seed", range(6))
def test_the_ram_replay_under_lru_keeps_what_the_stack_distances_say(seed: int, at_checkpoints: bool) -> None:
    """The replay that other policies need agrees with Mattson's one pass where both apply (LRU)."""
    history = RequestHistory(columns_of(random_log(seed, requests=120, at_checkpoints=at_checkpoints)))
    blocks, marks = history._blocks, history._checkpoints
    for budget, ttl in ((40, math.inf), (120, math.inf), (120, 30.0)):
        in_blocks, in_marks = replay_ram(history.log, blocks, marks, budget, ttl, "lru", history._entry_kept)
        for rows, replayed in ((blocks, in_blocks), (marks, in_marks)):
            stack = (rows.ram < NEVER) & (rows.ram <= budget) & (rows.ram_age <= ttl)
            assert replayed.tolist() == stack.tolist(), (budget, ttl)
    value = history.gains(math.inf, ram_budget=120, ram_policy="value")
    assert 0 <= value.reused_at(0) <= history.gains(math.inf, ram_budget=math.inf).reused_at(0)
