"""Flash attention's `auto`: off where several clients' answers batch, elsewhere measured on the bundled model
once and remembered, and in force in the context the engine opens."""

from __future__ import annotations

from pathlib import Path

import pytest

from cache.memory_kinds import MemoryKind, PlainMemory, RecurrentMemory, WindowMemory
from chatapp.engine import flash_choice, verdict_memo
from chatapp.engine.engine import Engine, EngineConfig
from chatapp.engine.flash_choice import (
    AUTO_ENV,
    FlashChoice,
    decided_flash,
    flash_key,
    flash_pays,
    measure_flash,
    unmeasured_kind,
)
from chatapp.engine.kv_types import KvType
from chatapp.engine.llama_native import NativeModel
from chatapp.errors import LoadCancelled
from chatapp.settings import Settings
from tests.model_factory import write_tiny_gemma3


@pytest.mark.parametrize(
    ("prefill", "decode", "pays"),
    [
        (1.32, 1.03, True),  # AVX2 kernels on one Xeon: the prefill gains
        (1.00, 1.10, True),
        (1.09, 1.09, False),  # within one run's noise
        (1.40, 0.96, False),  # one gains, the other loses
        (0.96, 0.86, False),
    ],
)
def test_flash_attention_pays_only_clearly_faster_in_one_and_not_slower_in_the_other(
    prefill: float, decode: float, pays: bool
) -> None:
    assert flash_pays(prefill, decode) is pays


def decided(model_path: Path, setting: bool | str, **changes: object) -> FlashChoice | None:
    options: dict[str, object] = {
        "kv_type": KvType.F16,
        "serves_many": False,
        "batch_answers": True,
        "sequences": 4,
        "model": model_path,
    }
    options.update(changes)
    return decided_flash(setting, **options)  # type: ignore[arg-type]


def test_what_is_decided_before_the_weights_load(model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(AUTO_ENV)
    assert decided(model_path, True) == FlashChoice(True, "as set")
    assert decided(model_path, False) == FlashChoice(False, "as set")
    assert decided(model_path, False, kv_type=KvType.Q8_0) == FlashChoice(True, "the q8_0 KV cache needs it")
    server = decided(model_path, "auto", serves_many=True)  # the bundled model's answers batch exactly
    assert server is not None
    assert not server.on
    assert "batch" in server.why
    assert decided(model_path, "auto", serves_many=True, sequences=1) is None  # one client at a time: measured
    assert decided(model_path, "auto", serves_many=True, batch_answers=False) is None
    assert decided(model_path, "auto") is None  # the TUI and ask: measured
    monkeypatch.setenv(AUTO_ENV, "off")
    assert decided(model_path, "auto") == FlashChoice(False, f"auto, off by {AUTO_ENV}")
    with pytest.raises(ValueError, match="on, off or auto"):
        decided(model_path, "fast")


def test_auto_measures_once_and_the_context_runs_what_it_chose(
    model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(AUTO_ENV)
    memo = tmp_path / "verdicts.json"
    measured: list[FlashChoice] = []
    real_measure = flash_choice.measure_flash

    def counted(*args: object, **kwargs: object) -> FlashChoice:
        choice = real_measure(*args, **kwargs)  # type: ignore[arg-type]
        measured.append(choice)
        return choice

    monkeypatch.setattr("chatapp.engine.loading.measure_flash", counted)
    shares: list[float] = []
    config = EngineConfig(
        model_path=model_path,
        context_cap=1024,
        sequences=1,
        flash_attention="auto",
        batch_memo=memo,
        load_progress=lambda share: not shares.append(share),  # type: ignore[func-returns-value]
    )
    with Engine(config) as engine:
        info = engine.info
    assert len(measured) == 1
    choice = measured[0]
    assert info.flash_attention is choice.on
    assert info.flash_attention_why == choice.why
    assert choice.why.startswith("measured: prefill ")
    assert 1 <= len(choice.rounds) <= 2
    assert choice.on is all(flash_pays(*gains) for gains in choice.rounds)  # on only where every round pays
    assert f"{choice.rounds[0][0]:.2f}x" in choice.why
    assert shares == sorted(shares)  # the bar only moves forward, through the measurement
    assert shares[-1] == pytest.approx(1.0)

    with Engine(config) as again:  # remembered in this process: not measured again
        assert again.info.flash_attention is choice.on
    assert len(measured) == 1
    key = flash_key(model_path, threads=again.info.threads, gpu_layers=0, swa_full=True)
    monkeypatch.setattr(verdict_memo, "_SEEN", {})  # a later process reads the memo file
    recalled = flash_choice.recalled_flash(key, memo)
    assert recalled is not None
    assert (recalled.on, recalled.why) == (choice.on, choice.why)


def test_a_measurement_is_cancelled_by_its_progress(model_path: Path, tmp_path: Path) -> None:
    model = NativeModel(model_path)
    try:
        with pytest.raises(LoadCancelled):
            measure_flash(
                model,
                "cancelled",
                tmp_path / "memo.json",
                threads=2,
                n_batch=512,
                swa_full=True,
                progress=lambda _: False,
            )
    finally:
        model.close()
    assert not (tmp_path / "memo.json").exists()  # nothing remembered from half a measurement


def test_settings_written_before_auto_still_load() -> None:
    assert Settings().flash_attention == "auto"
    assert Settings.model_validate({"flash_attention": True}).flash_attention == "on"
    assert Settings.model_validate({"flash_attention": False}).flash_attention == "off"


def test_auto_keeps_flash_attention_off_without_measuring_for_a_sliding_window_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Restores of window, recurrent and hybrid models are checked bit for bit without flash attention on a CPU."""
    monkeypatch.delenv(AUTO_ENV)
    assert unmeasured_kind(PlainMemory()) is None
    for memory in (WindowMemory(512), RecurrentMemory()):
        choice = unmeasured_kind(memory)
        assert choice is not None
        assert not choice.on
        assert memory.kind.value in choice.why

    def measured(*_args: object, **_kwargs: object) -> FlashChoice:
        raise AssertionError("a sliding-window model is not measured")

    monkeypatch.setattr("chatapp.engine.loading.measure_flash", measured)
    model = write_tiny_gemma3(tmp_path / "tiny-gemma3.gguf")
    config = EngineConfig(model_path=model, context_cap=512, sequences=1, flash_attention="auto", threads=1)
    with Engine(config) as engine:
        assert engine.info.memory_kind is MemoryKind.ISWA
        assert not engine.info.flash_attention
        assert "iswa" in engine.info.flash_attention_why
