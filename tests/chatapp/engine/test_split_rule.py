"""The prompt split probe: whole against split, bit for bit; its verdict probed once and remembered."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from chatapp.engine import split_rule, verdict_memo
from chatapp.engine.llama_native import NativeContext, NativeModel
from chatapp.engine.split_rule import fixed_batches, split_problem


def test_a_split_whose_logits_differ_in_one_bit_is_found_and_the_sequence_is_left_empty(
    loaded: tuple[NativeModel, NativeContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, context = loaded
    real = NativeContext.logits_split_at

    def one_split_rounds_otherwise(self: NativeContext, tokens: list[int], splits: list[int]) -> np.ndarray:
        logits = real(self, tokens, splits)
        if splits == [2]:  # the first split probed
            logits[0] = np.nextafter(logits[0], np.float32(np.inf))
        return logits

    monkeypatch.setattr(NativeContext, "logits_split_at", one_split_rounds_otherwise)
    problem = split_problem(model, context, min_rows=2)
    assert problem is not None
    assert problem.startswith(
        f"{split_rule.PROBE_TOKENS} prompt tokens computed as 2+{split_rule.PROBE_TOKENS - 2} end "
    )
    assert context.min_position(0) == -1  # nothing left in sequence 0


def test_every_split_is_tried_a_long_one_too_and_no_batch_is_smaller_than_the_rows_asked(
    loaded: tuple[NativeModel, NativeContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, context = loaded
    seen: list[list[int]] = []

    def alike(self: NativeContext, tokens: list[int], splits: list[int]) -> np.ndarray:
        seen.append([*splits, len(tokens)])
        return np.zeros(model.n_vocab, dtype=np.float32)  # every split agrees: every one is tried

    monkeypatch.setattr(NativeContext, "logits_split_at", alike)
    assert split_problem(model, context, min_rows=20) is None
    splits = [ends for ends in seen if len(ends) == 2]
    assert len(splits) >= 3  # flash attention's rows leave room for two cuts, and the long prompt's
    for ends in splits:
        sizes = np.diff([0, *ends])
        assert sizes.min() >= 20, ends
    assert max(ends[-1] for ends in seen) == split_rule.LONG_PROBE_TOKENS  # a longer prompt split too


def test_the_verdict_is_probed_once_and_remembered_for_later_loads(
    loaded: tuple[NativeModel, NativeContext], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    model, context = loaded
    probes: list[str | None] = []

    def counted(*args: Any) -> str | None:
        probes.append("probed")
        return "it differs"

    monkeypatch.setattr(split_rule, "split_problem", counted)
    memo = tmp_path / "verdicts.json"
    key = f"test|{tmp_path}"
    assert fixed_batches(model, context, gpu_layers=0, min_rows=2, key=key, memo=memo) == "it differs"
    monkeypatch.setattr(verdict_memo, "_SEEN", {})  # a new process: only the file remembers
    assert fixed_batches(model, context, gpu_layers=0, min_rows=2, key=key, memo=memo) == "it differs"
    assert probes == ["probed"]


def test_offloaded_layers_use_the_grid_and_a_probe_that_cannot_run_too(
    loaded: tuple[NativeModel, NativeContext], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    model, context = loaded

    def refused(*args: Any) -> str | None:
        raise RuntimeError("llama_decode failed with status -1")

    monkeypatch.setattr(split_rule, "split_problem", refused)
    memo = tmp_path / "verdicts.json"
    offloaded = fixed_batches(cast(Any, None), cast(Any, None), gpu_layers=1, min_rows=2, key="gpu", memo=memo)
    assert offloaded == "GPU kernels are chosen by the number of rows"
    failed = fixed_batches(model, context, gpu_layers=0, min_rows=2, key=f"failed|{tmp_path}", memo=memo)
    assert failed == "the split probe could not run (llama_decode failed with status -1)"
    assert not memo.exists()  # not a verdict: the next load probes again


def test_every_trial_fits_a_sequence_smaller_than_a_batch(
    loaded: tuple[NativeModel, NativeContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, _ = loaded
    small = NativeContext(model, n_sequences=1, n_ctx_per_sequence=128, n_threads=2, n_batch=512)
    try:
        sizes: list[int] = []
        real = NativeContext.logits_split_at

        def noted(self: NativeContext, tokens: list[int], splits: list[int]) -> np.ndarray:
            sizes.append(len(tokens))
            return real(self, tokens, splits)

        monkeypatch.setattr(NativeContext, "logits_split_at", noted)
        split_problem(model, small, min_rows=2)  # a trial past the sequence's room would raise (llama_decode)
        assert sizes
        assert max(sizes) <= small.shape.n_ctx_per_sequence
    finally:
        small.close()
