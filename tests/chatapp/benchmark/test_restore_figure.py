"""Figure R: each restore path is timed step by step, and reported with its goals."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from chatapp.benchmark import runner
from chatapp.benchmark.peers import PeerSettings
from chatapp.benchmark.restore_figure import (
    COLD,
    MIN_PREFIX_TOKENS,
    PATHS,
    RestoreFigures,
    RestoreSteps,
    can_drop_pages,
    measure_restores,
    restore_figure_verdicts,
    restore_table,
)
from tests.chatapp.benchmark.figure_support import measured
from tests.model_factory import write_tiny_llama


@pytest.mark.slow
def test_every_path_restores_the_prefix_and_times_its_steps(tiny_model: Path, tmp_path: Path) -> None:
    settings = PeerSettings(model_path=tiny_model, context=512, threads=1, block_size=16)
    figures = measured(measure_restores, settings, tmp_path / "restores", prefix_tokens=80, repeats=2, miss_repeats=1)
    assert set(figures.paths) == (set(PATHS) if can_drop_pages() else set(PATHS) - {COLD})
    whole, blocks, disk = (figures.paths[path] for path in PATHS[:3])
    assert whole.read_ms == 0.0  # loaded as kept: nothing read or assembled
    assert blocks.read_ms > 0.0
    assert disk.read_ms > 0.0
    copy_ms = figures.copy_ms or 0.0  # measured with or without a cold disk (None fails below)
    assert copy_ms > 0.0
    assert figures.blocks_floor == pytest.approx((copy_ms + figures.ready_load_ms) / figures.ready_load_ms)
    if not can_drop_pages():  # no posix_fadvise here: no cold path, and R says so by leaving it out
        assert figures.sequential_read_ms is None
        return
    cold = figures.paths[COLD]
    assert cold.read_ms > 0.0
    assert figures.sequential_read_ms is not None
    assert figures.sequential_read_ms > 0.0
    for steps in figures.paths.values():
        assert steps.load_ms > 0.0
        assert steps.total_ms >= steps.load_ms
    assert figures.miss_ms > 0.0
    assert figures.no_cache_ms > 0.0
    verdicts = restore_figure_verdicts(figures)
    assert [verdict.goal for verdict in verdicts] == ["R"] * 5
    assert verdicts[0].value == pytest.approx(whole.total_ms / figures.ready_load_ms)
    assert verdicts[3].value == pytest.approx(cold.total_ms / figures.sequential_read_ms)
    assert not list((tmp_path / "restores").glob("sequential.bin"))  # the yardstick's file is gone
    assert (figures.cold_floor or 0.0) > 1.0
    assert not figures.by_kv_type  # the tiny llama's heads are shorter than a quantized block
    assert set(figures.state_bytes) == set(figures.bytes_per_token) == {"f16"}


def _steps(load_ms: float, total_ms: float) -> RestoreSteps:
    return RestoreSteps(lookup_ms=0.1, read_ms=3.0, load_ms=load_ms, total_ms=total_ms)


def test_the_floors_through_the_state_api_are_a_copy_or_the_read_then_the_load() -> None:
    figures = RestoreFigures(
        prefix_tokens=2000,
        repeats=5,
        paths={path: _steps(4.0 if path != PATHS[0] else 4.5, 10.0) for path in PATHS},
        miss_ms=100.0,
        no_cache_ms=100.0,
        elapsed_s=1.0,
        sequential_read_ms=8.0,
        copy_ms=3.0,
    )
    assert figures.ready_load_ms == 4.0  # the block restores' load step
    assert figures.blocks_floor == pytest.approx((3.0 + 4.0) / 4.0)
    assert figures.cold_floor == pytest.approx((8.0 + 4.0) / 8.0)
    table = restore_table(figures)
    assert "a copy (3.0 ms) then the load, 1.75x the load" in table
    assert "the one-file read then the load, 1.50x the read" in table
    unmeasured = dataclasses.replace(figures, sequential_read_ms=None, copy_ms=None)
    assert unmeasured.blocks_floor is None
    assert unmeasured.cold_floor is None
    assert "the least through" not in restore_table(unmeasured)  # no floor where this run measured none


@pytest.mark.slow
def test_the_restore_paths_are_timed_in_each_quantized_kv_type(tmp_path: Path) -> None:
    wide = write_tiny_llama(tmp_path / "wide.gguf", n_embd=128)  # heads of 32 values: every type's block
    settings = PeerSettings(model_path=wide, context=512, threads=1, block_size=16)
    # Long enough that, past the 64 tokens flash attention computes again, a whole state is worth loading.
    figures = measured(measure_restores, settings, tmp_path / "restores", prefix_tokens=300, repeats=1, miss_repeats=1)
    assert set(figures.by_kv_type) == {"q8_0", "q4_0"}
    for paths in figures.by_kv_type.values():
        assert set(paths) == set(PATHS)
        assert all(steps.load_ms > 0.0 for steps in paths.values())
    # The same prefix in fewer bytes: ggml's blocks, 34 and 18 bytes per 32 values against f16's 64.
    assert figures.bytes_per_token["q8_0"] * 64 == figures.bytes_per_token["f16"] * 34
    assert figures.bytes_per_token["q4_0"] * 64 == figures.bytes_per_token["f16"] * 18
    for kv_type, size in figures.state_bytes.items():
        assert size > 200 * figures.bytes_per_token[kv_type], kv_type  # most of the 300-token prefix
    assert "in q8_0 KV cells" in restore_table(figures)


@pytest.mark.slow
def test_the_bench_reports_figure_r(tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--scale", "tiny", "--model", str(tiny_model), "--threads", "1", "--workloads", "R"]
    assert runner.main([*argv, "--peers", "chatapp", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert f"R  restoring a {MIN_PREFIX_TOKENS}-token prefix" in printed  # the scale's 60, raised to the least R takes
    report = json.loads((tmp_path / "bench.json").read_text())
    assert set(report["meta"]["cache_figures"]["restores"]["paths"]) == set(PATHS)
    assert {goal["goal"] for goal in report["goals"]} == {"R"}
