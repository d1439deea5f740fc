"""Figure W on a tiny model: every path restores the prefix as computed cold, each step measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatapp.benchmark.large_state_figure import (
    RESTORE_PATHS,
    large_state_figure_verdicts,
    large_state_table,
    measure_large_state,
)
from chatapp.benchmark.peers import PeerSettings
from chatapp.benchmark.restore_figure import can_drop_pages
from tests.chatapp.benchmark.figure_support import measured


@pytest.mark.slow
def test_every_path_restores_the_large_prefix_as_cold_and_is_measured(tiny_model: Path, tmp_path: Path) -> None:
    settings = PeerSettings(model_path=tiny_model, threads=1, block_size=16)
    figures = measured(measure_large_state, settings, tmp_path / "large", prefix_tokens=200)
    expected = set(RESTORE_PATHS) if can_drop_pages() else set(RESTORE_PATHS) - {"disk, cold"}
    assert set(figures.restores) == expected
    assert all(restore.equal_to_cold for restore in figures.restores.values())
    assert all(restore.ms > 0 for restore in figures.restores.values())
    assert figures.prefix_tokens >= 200
    assert figures.state_bytes > 0
    assert figures.baseline_peak_bytes > 0
    assert figures.store_equal_to_cold
    assert figures.ready_load_ms > 0
    assert figures.decode_idle_tps > 0
    assert figures.decode_storing_tps > 0
    verdicts = large_state_figure_verdicts(figures)
    assert {verdict.goal for verdict in verdicts} == {"W"}
    assert [verdict.met for verdict in verdicts if "equal to cold" in verdict.measure] == [True]
    assert "disk, warm" in large_state_table(figures)
