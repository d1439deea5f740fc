"""Restore or compute: the faster measured path wins; unmeasured, a hit is restored."""

from __future__ import annotations

from chatapp.engine.restore_costs import RETRY_EVERY, RestoreCosts


def test_until_both_speeds_are_measured_a_hit_is_restored() -> None:
    costs = RestoreCosts()
    assert costs.should_restore("disk", 500, 500)
    costs.note_prefill(512, 0.5)
    assert costs.should_restore("disk", 500, 500)  # the disk path is not measured yet
    assert costs.recomputed == 0


def test_the_faster_path_wins() -> None:
    costs = RestoreCosts()
    costs.note_prefill(512, 0.512)  # 1 ms per token
    costs.note_restore("disk", 1000, 20.0)  # 0.02 ms per token
    costs.note_restore("ram", 1000, 2000.0)  # 2 ms per token
    assert costs.should_restore("disk", 1000, 1000)
    assert not costs.should_restore("ram", 1000, 1000)
    assert costs.recomputed == 1
    # Restoring 20,000 tokens to spare computing 300 of them: computing is faster.
    assert not costs.should_restore("disk", 20000, 300)
    assert costs.should_restore("ram", 200, 200)  # too small a hit to choose by speeds: restored


def test_a_path_judged_slower_is_tried_again_now_and_then() -> None:
    costs = RestoreCosts()
    costs.note_prefill(512, 0.512)
    costs.note_restore("disk", 1000, 5000.0)
    decisions = [costs.should_restore("disk", 1000, 1000) for _ in range(RETRY_EVERY)]
    assert decisions == [False] * (RETRY_EVERY - 1) + [True]
    assert costs.restored == 1  # counted when a restore is done, not when it is chosen


def test_short_measurements_are_ignored_and_long_ones_smoothed() -> None:
    costs = RestoreCosts()
    costs.note_prefill(8, 10.0)  # mostly fixed overhead: not a speed
    assert "computing" not in costs.describe()  # no speed yet
    costs.note_prefill(100, 0.1)
    costs.note_prefill(100, 0.2)
    smoothed = costs.prefill_ms_per_token
    assert smoothed is not None
    assert 1.0 < smoothed < 2.0


def test_the_description_names_the_counts_and_speeds() -> None:
    costs = RestoreCosts()
    assert costs.describe() == "0 restored, 0 computed instead (measured faster)"
    costs.note_prefill(100, 0.1)
    costs.note_restore("ram", 100, 1.0)
    line = costs.describe()
    assert "computing 1.000" in line
    assert "restoring ram 0.0100" in line
