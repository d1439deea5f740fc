"""Sizing advice: Mattson's one pass agrees with a plain LRU replay of the same model at every budget."""

from __future__ import annotations

import math

import pytest

from cache.request_log import columns_of
from cache.sizing import RequestHistory
from tests.cache.sizing_reference import random_log, replay_reused

BUDGETS = [0, 10, 25, 40, 70, 120, 250, 1000, math.inf]


@pytest.mark.parametrize("at_checkpoints", [False, True], ids=["blocks", "checkpoints"])
@pytest.mark.parametrize("seed", range(12))
def test_one_pass_agrees_with_a_replay_at_every_budget(seed: int, at_checkpoints: bool) -> None:
    events = random_log(seed, at_checkpoints=at_checkpoints)
    history = RequestHistory(columns_of(events))
    for ttl in (math.inf, 30.0):
        for ram in (0, 40, 250):
            gains = history.gains(ttl, ram_budget=ram)
            for disk in BUDGETS:
                assert gains.reused_at(disk) == replay_reused(events, ram, disk, ttl), (ttl, ram, disk)
