"""The cache figures of `chatapp bench`: lookup among many conversations (L) and storage (S)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chatapp.benchmark import runner
from chatapp.benchmark.cache_figures import (
    StorageWork,
    distinct_tokens,
    measure_lookup,
    measure_storage,
    measure_storage_by_type,
)
from chatapp.benchmark.peers import PeerSettings
from chatapp.engine.kv_types import KvType
from tests.chatapp.benchmark.figure_support import measured
from tests.model_factory import write_tiny_llama


def test_distinct_tokens_count_shared_prefixes_once() -> None:
    assert distinct_tokens([(1, 2, 3), (1, 2, 4), (1, 5), (1, 2, 3)]) == 3 + 1 + 1 + 0
    assert distinct_tokens([]) == 0


def test_lookups_find_what_each_kind_of_prompt_shares_with_the_index() -> None:
    figures = measure_lookup(40, persona_tokens=128, question_tokens=16, block_size=16)
    # The persona's 8 blocks are shared; each conversation adds its own last block.
    assert figures.blocks == 128 // 16 + 40
    assert figures.follow_up["median_matched_tokens"] == 128 + 16
    assert figures.new_question["median_matched_tokens"] == 128
    assert figures.no_match["median_matched_tokens"] == 0
    assert 0 < figures.new_question["median_ms"] <= figures.new_question["p99_ms"] <= figures.new_question["max_ms"]


@pytest.mark.slow
def test_storage_weighs_the_folder_against_the_distinct_tokens(tiny_model: Path, tmp_path: Path) -> None:
    settings = PeerSettings(model_path=tiny_model, context=512, threads=1, block_size=16)
    figures = measured(measure_storage, settings, tmp_path / "storage", StorageWork(3, 60, 10, 4))
    assert figures.distinct_tokens > 60  # the persona once, then each question and answer
    assert figures.distinct_kv_bytes == figures.distinct_tokens * figures.kv_bytes_per_token
    assert figures.stored_payload_bytes >= figures.distinct_kv_bytes, "every distinct token is stored"
    assert figures.folder_bytes >= figures.stored_payload_bytes
    assert figures.ratio == figures.folder_bytes / figures.distinct_kv_bytes


@pytest.mark.slow
def test_storage_in_each_kv_type_weighs_its_bytes_and_its_answers_against_f16(tmp_path: Path) -> None:
    wide = write_tiny_llama(tmp_path / "wide.gguf", n_embd=128)  # heads of 32 values: every type's block
    settings = PeerSettings(model_path=wide, context=512, threads=1, block_size=16)
    by_type = measured(measure_storage_by_type, settings, tmp_path / "storage", StorageWork(3, 60, 10, 6))
    assert set(by_type.figures) == set(KvType)
    assert not by_type.refused
    assert by_type.bytes_ratio(KvType.Q8_0) == 34 / 64
    assert by_type.bytes_ratio(KvType.Q4_0) == 18 / 64
    for kv_type, figures in by_type.figures.items():
        assert figures.kv_type == kv_type
        assert len(figures.answers) == 3
        assert all(len(answer) <= 6 for answer in figures.answers)  # at most max_tokens (an end may come first)
    identical, share = by_type.agreement(KvType.F16)
    assert (identical, share) == (3, 1.0)  # f16 against itself
    identical, share = by_type.agreement(KvType.Q4_0)
    assert 0 <= identical <= 3
    assert 0.0 <= share <= 1.0
    assert (identical == 3) == (share == 1.0)


@pytest.mark.slow
def test_the_bench_reports_the_figures_with_their_goals(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--scale", "tiny", "--model", str(tiny_model), "--threads", "1", "--workloads", "L,S"]
    assert runner.main([*argv, "--peers", "chatapp", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "L  lookup among 200 conversations" in printed
    assert "S  storage, 3 conversations on one persona" in printed
    report = json.loads((tmp_path / "bench.json").read_text())
    assert set(report["meta"]["cache_figures"]) == {
        "lookup",
        "storage",
        "storage_by_kv_type",
        "storage_refused_kv_types",
    }
    # The tiny llama's heads (16 values) are shorter than a quantized block: those types are refused.
    assert set(report["meta"]["cache_figures"]["storage_refused_kv_types"]) == {"q8_0", "q4_0"}
    assert "q8_0: not measured" in printed
    assert {goal["goal"] for goal in report["goals"]} == {"L", "S"}
