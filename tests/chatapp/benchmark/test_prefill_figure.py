"""Figure P: prefill speed with nothing cached, flash attention off and on."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatapp.benchmark.peers import PeerSettings
from chatapp.benchmark.prefill_figure import PrefillFigures, measure_prefill, prefill_figure_verdicts
from tests.chatapp.benchmark.figure_support import measured


@pytest.mark.slow
def test_chatapp_prefill_is_measured_with_flash_attention_off_and_on(tiny_model: Path) -> None:
    settings = PeerSettings(model_path=tiny_model, context=512, threads=1)
    figures = measured(measure_prefill, settings, None, prompt_tokens=80, repeats=2)
    assert set(figures.tokens_per_s) == {"chatapp", "chatapp flash"}  # llama-server not asked for
    assert all(speed > 0 for speed in figures.tokens_per_s.values())
    assert figures.prompt_tokens > 80
    assert set(figures.decode_tokens_per_s) == {"chatapp"}
    assert figures.decode_tokens_per_s["chatapp"] > 0, "one stream's answer tokens per second"
    assert prefill_figure_verdicts(figures) == []  # no yardstick without llama-server


def test_the_verdicts_compare_each_mode_with_llama_servers_flash_attention() -> None:
    speeds = {"chatapp": 90.0, "chatapp flash": 110.0, "llama-server": 80.0, "llama-server flash": 100.0}
    verdicts = prefill_figure_verdicts(PrefillFigures(2000, 3, speeds, 1.0))
    assert [(verdict.value, verdict.met) for verdict in verdicts] == [(1.1, True), (0.9, False)]


def test_the_decode_row_is_judged_against_llama_server_at_097() -> None:
    speeds = {"chatapp": 90.0, "chatapp flash": 110.0, "llama-server": 80.0, "llama-server flash": 100.0}
    for chatapp, met in ((98.0, True), (96.0, False)):
        figures = PrefillFigures(2000, 3, speeds, 1.0, {"chatapp": chatapp, "llama-server": 100.0})
        (decode,) = [verdict for verdict in prefill_figure_verdicts(figures) if "decode" in verdict.measure]
        assert (decode.value, decode.met) == (chatapp / 100.0, met)
