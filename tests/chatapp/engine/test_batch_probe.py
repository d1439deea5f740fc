"""The batch-invariance probe tells batchable models from the others (issue 22, part 1).

Measured on the project's machine (x86-64, 2 threads, flash attention off, default
repacking): the bundled SmolLM2 Q4_1 and a tiny Q4_0 llama give every sequence the same bits
batched with others as alone, answers and prompt chunks alike; the same tiny llama in F16
does not (one row takes other kernels than several). If llama.cpp or the CPU changes that,
these tests say so before the engine batches on a stale assumption.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from chatapp.engine.batch_probe import PROBE_TEXTS, ProbeSettings, chunk_ends, probe
from chatapp.engine.batching import MIN_ROWS
from chatapp.engine.engine import Engine, EngineConfig
from chatapp.engine.llama_native import NativeContext
from chatapp.engine.loading import PROBE_SHARE
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.errors import LoadCancelled
from chatapp.model_files import bundled_model_path
from tests.model_factory import quantize_model, write_tiny_llama

SHORT = ProbeSettings(answer_steps=4, chunk=16)


@pytest.fixture(scope="module")
def tiny_f16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-F16.gguf", n_embd=256, n_ff=512)


@pytest.mark.parametrize("length", [*range(1, 70), 200])
def test_prompt_chunks_end_at_the_prompt_and_have_no_lone_token(length: int) -> None:
    ends = chunk_ends(length, 16)
    sizes = [end - start for start, end in zip([0, *ends], ends, strict=False)]
    assert ends[-1] == length
    assert all(MIN_ROWS <= size <= 16 + 1 for size in sizes) or sizes == [length]


@pytest.mark.slow
def test_the_bundled_model_batches_bit_for_bit() -> None:
    report = probe(bundled_model_path(), SHORT)
    assert sorted(report.answers) == list(range(2, len(PROBE_TEXTS) + 1))
    assert report.answers_identical, report.answers
    assert report.prompts.identical, report.prompts
    assert report.prompts.compared > len(PROBE_TEXTS)  # chunk ends and the answers after them


@pytest.mark.slow
def test_a_q4_0_model_batches_and_an_f16_one_does_not(tiny_f16: Path, tmp_path: Path) -> None:
    q4_0 = probe(quantize_model(tiny_f16, tmp_path / "tiny-Q4_0.gguf", "Q4_0"), SHORT)
    assert q4_0.answers_identical
    assert q4_0.prompts.identical
    f16 = probe(tiny_f16, SHORT)
    assert not f16.answers_identical
    assert 0 < f16.answers_max_diff < 1  # rounding, not a wrong sequence's logits


@pytest.mark.slow
def test_a_start_up_probe_llama_cpp_cannot_run_means_no_batching_not_a_failed_load(
    tiny_f16: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(context: NativeContext, entries: object) -> None:
        raise RuntimeError("llama_decode failed with status -1")

    monkeypatch.setattr(NativeContext, "decode_answers", refused)
    model = quantize_model(tiny_f16, tmp_path / "tiny-Q4_0.gguf", "Q4_0")  # the rule lets it through to the probe
    memo = tmp_path / "verdicts.json"
    with Engine(EngineConfig(model_path=model, context_cap=128, sequences=3, threads=1, batch_memo=memo)) as engine:
        batches, problem = engine.batching
        assert not batches
        assert problem == "the probe could not run (llama_decode failed with status -1)"
        remembered = json.loads(memo.read_text()) if memo.exists() else {}
        # (the prompt split probe's own verdict may be there)
        assert all(key.startswith("splits|") for key in remembered), "not a verdict: the next load probes again"
        request = GenerationRequest(tuple(range(3, 12)), SamplingParams(temperature=0.0, max_tokens=3), use_cache=False)
        assert engine.generate(request).wait().stats.computed_tokens == 9  # it answers, alone


@pytest.mark.slow
def test_a_first_load_shows_the_probe_in_its_progress_and_a_later_one_does_not(tiny_f16: Path, tmp_path: Path) -> None:
    model = quantize_model(tiny_f16, tmp_path / "tiny-Q4_0.gguf", "Q4_0")
    memo = tmp_path / "verdicts.json"

    def load(stop_above: float = 2.0) -> list[float]:
        heard: list[float] = []

        def progress(share: float) -> bool:
            heard.append(share)
            return share <= stop_above

        config = EngineConfig(model_path=model, context_cap=128, sequences=3, threads=1, batch_memo=memo)
        with Engine(replace(config, load_progress=progress)) as engine:
            assert engine.batching == (True, None)
        return heard

    weights_end = 1.0 - PROBE_SHARE
    with pytest.raises(LoadCancelled):  # Esc while the probe runs stops the load, and nothing is remembered
        load(stop_above=weights_end + 0.01)
    assert not memo.exists()
    first = load()
    assert first == sorted(first)
    probing = [share for share in first if share > weights_end]  # each answer alone, 2 and 3 together, the end
    assert probing == pytest.approx([weights_end + PROBE_SHARE * step / 5 for step in range(1, 6)] + [1.0])
    assert max(share for share in first if share <= weights_end) == pytest.approx(weights_end)
    later = load()  # the verdict is remembered: the weights fill the whole bar
    assert later == sorted(later)
    assert later[-1] == pytest.approx(1.0)
    assert len(later) == len(first) - 5  # the same weights' steps and the end, no probe steps


@pytest.mark.slow
def test_a_verdict_holds_for_the_group_sizes_probed_and_a_refused_model_s_bar_still_ends(
    tiny_f16: Path, tmp_path: Path
) -> None:
    model = quantize_model(tiny_f16, tmp_path / "tiny-Q4_0.gguf", "Q4_0")
    memo = tmp_path / "verdicts.json"
    for sequences in (2, 3, 3):  # 3 together were never probed by the first load
        with Engine(EngineConfig(model_path=model, context_cap=128, sequences=sequences, threads=1, batch_memo=memo)):
            pass
    verdicts = json.loads(memo.read_text(encoding="utf-8"))
    assert len([key for key in verdicts if not key.startswith("splits|")]) == 2  # (besides the split probe's)
    heard: list[float] = []
    config = EngineConfig(model_path=tiny_f16, context_cap=128, sequences=3, threads=1, batch_memo=memo)

    def progress(share: float) -> bool:
        heard.append(share)
        return True

    with Engine(replace(config, load_progress=progress)) as engine:
        assert engine.batching[1] is not None  # the rule refuses F16 before any probe
    assert heard[-1] == pytest.approx(1.0)
