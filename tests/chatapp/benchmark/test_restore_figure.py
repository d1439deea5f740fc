"""Figure R: each restore path is timed step by step, and reported with its goals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chatapp.benchmark import runner
from chatapp.benchmark.peers import PeerSettings
from chatapp.benchmark.restore_figure import PATHS, measure_restores, restore_figure_verdicts
from tests.chatapp.benchmark.figure_support import measured


@pytest.mark.slow
def test_every_path_restores_the_prefix_and_times_its_steps(tiny_model: Path, tmp_path: Path) -> None:
    settings = PeerSettings(model_path=tiny_model, context=512, threads=1, block_size=16)
    figures = measured(measure_restores, settings, tmp_path / "restores", prefix_tokens=80, repeats=2, miss_repeats=1)
    assert set(figures.paths) == set(PATHS)
    whole, blocks, disk = (figures.paths[path] for path in PATHS)
    assert whole.read_ms == whole.assemble_ms == 0.0  # loaded as kept: nothing read or assembled
    assert blocks.assemble_ms > 0.0
    assert disk.read_ms > 0.0
    for steps in figures.paths.values():
        assert steps.load_ms > 0.0
        assert steps.total_ms >= steps.load_ms
    assert figures.miss_ms > 0.0
    assert figures.no_cache_ms > 0.0
    verdicts = restore_figure_verdicts(figures)
    assert [verdict.goal for verdict in verdicts] == ["R", "R", "R", "R"]
    assert verdicts[0].value == pytest.approx(whole.total_ms / figures.ready_load_ms)


@pytest.mark.slow
def test_the_bench_reports_figure_r(tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--scale", "tiny", "--model", str(tiny_model), "--threads", "1", "--workloads", "R"]
    assert runner.main([*argv, "--peers", "chatapp", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "R  restoring a 60-token prefix" in printed
    report = json.loads((tmp_path / "bench.json").read_text())
    assert set(report["meta"]["cache_figures"]["restores"]["paths"]) == set(PATHS)
    assert {goal["goal"] for goal in report["goals"]} == {"R"}
