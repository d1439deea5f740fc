"""Figure N: clients at once over HTTP (two `chatapp serve`, batched and not), and prompts together in process."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatapp.benchmark.peers import PeerSettings
from chatapp.benchmark.streams_figure import (
    BATCHED,
    SERVER,
    UNBATCHED,
    SideFigures,
    StreamsFigures,
    measure_streams,
    streams_figure_verdicts,
    streams_record,
    streams_table,
)
from tests.chatapp.benchmark.figure_support import measured


@pytest.mark.slow
def test_one_and_three_clients_are_measured_on_both_chatapp_servers(tiny_model: Path, tmp_path: Path) -> None:
    figures = measured(
        measure_streams,
        PeerSettings(model_path=tiny_model, context=512, threads=1),
        None,
        tmp_path / "work",
        clients=(1, 3),
        rounds=1,
        answer_tokens=4,
        prompt_context=48,
    )
    assert set(figures.by_clients) == {1, 3}
    for sides in figures.by_clients.values():
        assert set(sides) == {BATCHED, UNBATCHED}  # llama-server not asked for
        for side in sides.values():
            assert side.requests_per_minute > 0
            assert side.answer_tokens_per_s > 0
            assert 0 < side.ttft_median_ms <= side.ttft_p95_ms
    assert figures.prompts_together_ratio > 0
    assert figures.prompt_context == 48
    assert figures.prompt_tokens >= 16
    assert streams_record(figures)["by_clients"]["3"][BATCHED]["requests_per_minute"] > 0
    assert "llama-server" not in streams_table(figures)
    assert [verdict.measure for verdict in streams_figure_verdicts(figures)] == [
        "answer tok/s, 1 client, batched / unbatched"
    ]


def _side(tokens_per_s: float) -> SideFigures:
    return SideFigures(
        requests_per_minute=60.0, answer_tokens_per_s=tokens_per_s, ttft_median_ms=100.0, ttft_p95_ms=150.0
    )


def test_three_clients_are_judged_against_llama_server_and_one_against_unbatched() -> None:
    by_clients = {
        1: {BATCHED: _side(97.0), UNBATCHED: _side(100.0), SERVER: _side(120.0)},
        3: {BATCHED: _side(165.0), UNBATCHED: _side(100.0), SERVER: _side(150.0)},
    }
    figures = StreamsFigures(128, 3, by_clients, 2000, 160, 0.95, 1.0)
    verdicts = streams_figure_verdicts(figures)
    assert [(verdict.value, verdict.met) for verdict in verdicts] == [(165.0 / 150.0, True), (0.97, False)]
